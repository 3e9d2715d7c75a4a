"""The pipeline file (``pipelines.spec``): stages, their order, their edges, and every
problem with its file:line, before anything is submitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.pipelines.spec import Edge, PipelineFileError, parse_pipeline_file, topological


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # errors name the file relative to the working directory


def write(tmp_path: Path, text: str, name: str = "chain.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(PipelineFileError) as caught:
        parse_pipeline_file(path)
    return [str(i) for i in caught.value.issues]


def test_stages_come_after_their_predecessors_and_each_is_named_after_its_stage(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.yaml").write_text("defaults: [examples/mlp]\n")
    path = write(
        tmp_path,
        "stages:\n"
        "  report:\n"
        "    config: examples/mlp\n"
        "    after: [eval, export:any]\n"
        "  eval:\n"
        "    config: examples/mlp\n"
        "    after: train\n"
        "    set: [params.steps=5]\n"
        "  train:\n"
        "    config: train.yaml\n"
        "    set: {params.lr: 0.01, params.tag: '3e-4'}\n"
        "  export:\n"
        "    config: examples/mlp\n"
        "    after: train:started\n"
        "    set: {job.name: exporter}\n",
    )
    spec = parse_pipeline_file(path)
    assert spec.name == "chain"  # the file's name
    assert [s.name for s in spec.stages] == ["train", "eval", "export", "report"]
    train, evals, export, report = spec.stages
    assert train.config_path == tmp_path / "train.yaml"  # next to the file first
    assert train.overrides == ("job.name=train", "params.lr=0.01", 'params.tag="3e-4"')
    assert evals.overrides == ("job.name=eval", "params.steps=5")
    assert evals.after == (Edge("train", "ok"),)
    assert export.overrides == ("job.name=exporter",)  # its own job.name is kept
    assert export.after == (Edge("train", "started"),)
    assert report.after == (Edge("eval", "ok"), Edge("export", "any"))
    assert train.env == "DDLAUNCH_AFTER_TRAIN_DIR"
    # Where each override was written, for the config's own errors.
    assert dict(train.origins)["params.lr=0.01"] == "chain.yaml:11"
    assert dict(train.origins)["job.name=train"] == "chain.yaml:9"


def test_every_problem_is_named_with_its_line_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: a/b\n"
        "colour: red\n"
        "stages:\n"
        "  train:\n"
        "    config: nosuch.yaml\n"
        "    after: [train]\n"
        "  eval:\n"
        "    config: examples/mlp\n"
        "    after: [train:later, ghost, train, train:any]\n"
        "    set: [steps]\n"
        "    retries: 2\n"
        "  9lives:\n"
        "    config: examples/mlp\n"
        "  export: examples/mlp\n",
    )
    assert problems(path) == [
        "colour: unknown key (expected one of: name, stages) (chain.yaml:2)",
        "name: expected a name of ASCII letters, digits and _ . + - (not starting with . or -), "
        "at most 200 characters (chain.yaml:1)",
        "stages.train.config: no config 'nosuch.yaml' (looked next to this file and among "
        "the presets) (chain.yaml:5)",
        "stages.train.after: stage train cannot wait for itself (chain.yaml:6)",
        "stages.eval.retries: unknown key (expected one of: config, set, after) (chain.yaml:11)",
        "stages.eval.set: expected key.path=value (as --set takes it), got 'steps' (chain.yaml:10)",
        "stages.eval.after: unknown condition 'later' in 'train:later' (expected STAGE, "
        "STAGE:ok to wait until it completed, STAGE:any until it ended, STAGE:started "
        "until it started) (chain.yaml:9)",
        "stages.eval.after: no stage 'ghost' (stages: train, eval, 9lives, export) (chain.yaml:9)",
        "stages.eval.after: names stage train twice; give one condition per stage (chain.yaml:9)",
        "stages.9lives: a stage's name starts with a letter and holds letters, digits, _ "
        "and - (at most 64): it becomes the run's job.name (chain.yaml:12)",
        "stages.export: expected a mapping with config (and set, after) (chain.yaml:14)",
    ]


def test_a_cycle_is_refused_with_the_stages_on_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "stages:\n"
        "  prep: {config: examples/mlp}\n"
        "  a: {config: examples/mlp, after: [prep, c]}\n"
        "  b: {config: examples/mlp, after: a}\n"
        "  c: {config: examples/mlp, after: b}\n",
    )
    assert problems(path) == [
        "stages: the after: edges make a cycle among a, b, c (chain.yaml:1)",
    ]


def test_no_stages_and_a_file_that_is_no_mapping(tmp_path: Path) -> None:
    assert problems(write(tmp_path, "name: x\n")) == [
        "stages: expected a mapping of stage names to stages, e.g. train: {config: t.yaml} "
        "(chain.yaml)"
    ]


def test_two_stages_that_would_set_one_variable_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "stages:\n  pre-train: {config: examples/mlp}\n  pre_train: {config: examples/mlp}\n",
    )
    assert problems(path) == [
        "stages.pre_train: stages pre-train and pre_train would both set "
        "DDLAUNCH_AFTER_PRE_TRAIN_DIR (chain.yaml:3)"
    ]


def test_the_order_keeps_the_files_order_where_the_edges_allow(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "stages:\n"
        "  a: {config: examples/mlp}\n"
        "  d: {config: examples/mlp, after: c}\n"
        "  b: {config: examples/mlp}\n"
        "  c: {config: examples/mlp}\n",
    )
    stages = parse_pipeline_file(path).stages
    assert [s.name for s in stages] == ["a", "b", "c", "d"]
    assert topological(stages) == (list(stages), [])


def test_a_cycle_is_reported_with_the_files_other_mistakes(tmp_path: Path) -> None:
    # A stage left out for its own mistake (no config, a bad name) is still a stage to
    # wait for: its dependents make no cycle of it.
    path = write(
        tmp_path,
        "stages:\n"
        "  prep: {config: nosuch.yaml}\n"
        "  train: {config: examples/mlp, after: prep, retries: 2}\n"
        "  eval: {config: examples/mlp, after: [train, ghost]}\n"
        "  a: {config: examples/mlp, after: b}\n"
        "  b: {config: examples/mlp, after: a}\n",
    )
    assert problems(path) == [
        "stages.prep.config: no config 'nosuch.yaml' (looked next to this file and among "
        "the presets) (chain.yaml:2)",
        "stages.train.retries: unknown key (expected one of: config, set, after) (chain.yaml:3)",
        "stages.eval.after: no stage 'ghost' (stages: prep, train, eval, a, b) (chain.yaml:4)",
        "stages: the after: edges make a cycle among a, b (chain.yaml:1)",
    ]


def test_set_from_the_command_line_comes_after_each_stages_own(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "stages:\n"
        "  train:\n"
        "    config: examples/mlp\n"
        "    set: {params.steps: 40, params.lr: 0.01}\n"
        "  eval: {config: examples/mlp, after: train}\n",
    )
    spec = parse_pipeline_file(path, ["params.steps=7", "nodes.count=1"])
    train, evals = spec.stages
    assert train.overrides == (
        "job.name=train",
        "params.steps=40",
        "params.lr=0.01",
        "params.steps=7",
        "nodes.count=1",
    )
    assert evals.overrides == ("job.name=eval", "params.steps=7", "nodes.count=1")
    assert dict(train.origins)["params.steps=7"] == "--set params.steps=7"
    assert dict(train.origins)["params.steps=40"] == "chain.yaml:4"


def test_a_bad_set_from_the_command_line_is_named_once_with_the_files_mistakes(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "stages:\n  train: {config: examples/mlp, after: ghost}\n")
    with pytest.raises(PipelineFileError) as caught:
        parse_pipeline_file(path, ["steps", "params.lr=[1", "job.name=x", "params.steps=7"])
    assert str(caught.value) == (
        "invalid pipeline file (4 errors):\n"
        "  steps: expected --set key.path=value, e.g. nodes.count=4 (--set steps)\n"
        "  params.lr: the value is not valid YAML: '[1' (--set params.lr=[1)\n"
        "  job.name: every stage's job.name is its stage's name, which its dependents' "
        "$DDLAUNCH_AFTER_<STAGE>_DIR is named after; give a stage another one in its set: "
        "(--set job.name=x)\n"
        "  stages.train.after: no stage 'ghost' (stages: train) (chain.yaml:2)"
    )


def test_a_stage_s_param_with_an_unquoted_equals_is_refused_as_set_refuses_it(
    tmp_path: Path,
) -> None:
    from ddlaunch.pipelines.submit import check_pipeline

    path = write(
        tmp_path,
        "stages:\n"
        "  train:\n"
        "    config: examples/mlp\n"
        "    set: [params.lr=0.25=3]\n"
        "  eval:\n"
        "    config: examples/mlp\n"
        "    set: {params.tag: 'a=b'}\n",
    )
    with pytest.raises(PipelineFileError) as caught:
        check_pipeline(path)
    assert str(caught.value) == (
        "invalid pipeline file (1 error):\n"
        "  stages.train: params.lr: expected a number (the config has 0.05), got '0.25=3'; if "
        "the '=' is meant, quote the value: params.lr=\"0.25=3\" (chain.yaml:4)"
    )
    # The mapping form's value is a string already: its text is quoted, and it stands.
    evals = next(s for s in parse_pipeline_file(path).stages if s.name == "eval")
    assert evals.overrides[-1] == 'params.tag="a=b"'
