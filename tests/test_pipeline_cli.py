"""``ddlaunch pipeline FILE``, and a pipeline in ``status`` and ``cancel``: whole outputs of
the real CLI against the stand-in Slurm commands (``support.standin_cli``); the argv each
stand-in received is asserted whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.standin_cli import Cli

SQUEUE = "squeue -h -r -t all -j {ids} -o %i|%T|%r|%N"

PIPELINE = """\
name: train-eval
stages:
  train:
    config: examples/mlp
    set: {params.steps: 40}
  eval:
    config: examples/mlp
    after: train
  export:
    config: examples/mlp
    after: train:any
"""


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    (tmp_path / "chain.yaml").write_text(PIPELINE)
    return Cli(tmp_path)


def one(root: Path, prefix: str) -> Path:
    (found,) = [p for p in root.glob(f"{prefix}-2*") if p.is_dir()]
    return found


def sbatch_line(run_dir: Path, tmp: Path) -> str:
    return (
        f"sbatch --parsable --output={run_dir}/logs/batch-%j.out --chdir={tmp} {run_dir}/job.sbatch"
    )


def test_the_stages_are_submitted_in_order_each_after_its_predecessors_job(cli: Cli) -> None:
    cli.number_jobs(500)
    cli.answer(squeue="500|PENDING|Priority|\n")
    proc = cli("pipeline", "chain.yaml")
    pipeline = one(cli.root, "train-eval")
    train, evals, export = (one(cli.root, n) for n in ("train", "eval", "export"))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"pipeline {pipeline.name}: 3 stages\n"
        f"pipeline dir: {pipeline}\n"
        f"stage train   run {train.name}  job 500\n"
        f"stage eval    run {evals.name}  job 501  (after train:ok)\n"
        f"stage export  run {export.name}  job 502  (after train:any)\n",
        "",
    )
    # Each dependent asks where train's job is (one squeue call), then submits.
    assert cli.calls("squeue", "sbatch") == [
        sbatch_line(train, cli.tmp),
        SQUEUE.format(ids="500"),
        sbatch_line(evals, cli.tmp),
        SQUEUE.format(ids="500"),
        sbatch_line(export, cli.tmp),
    ]
    scripts = {d.name: (d / "job.sbatch").read_text() for d in (train, evals, export)}
    assert "--dependency" not in scripts[train.name]
    assert "\n#SBATCH --dependency=afterok:500\n" in scripts[evals.name]
    assert "\n#SBATCH --dependency=afterany:500\n" in scripts[export.name]
    for dependent in (evals, export):
        assert f"\nexport DDLAUNCH_AFTER_TRAIN_DIR={train}\n" in scripts[dependent.name]
    resolved = (train / "config.yaml").read_text()
    assert "name: train\n" in resolved and "steps: 40\n" in resolved
    # Train knows its dependents, so that `resume` of it moves them onto its new job.
    assert {
        d["run_id"] for d in json.loads((train / "dependents.json").read_text())["dependents"]
    } == {evals.name, export.name}
    record = json.loads((pipeline / "pipeline.json").read_text())
    assert [(s["name"], s["run_dir"], s["job_id"], s["after"]) for s in record["stages"]] == [
        ("train", str(train), "500", []),
        ("eval", str(evals), "501", ["train:ok"]),
        ("export", str(export), "502", ["train:any"]),
    ]
    assert (pipeline / "pipeline.yaml").read_text() == PIPELINE


def test_status_shows_a_pipeline_as_one_row_and_its_stages_when_named(cli: Cli) -> None:
    cli.number_jobs(500)
    cli.answer(squeue="500|PENDING|Priority|\n")
    assert cli("pipeline", "chain.yaml").returncode == 0
    pipeline = one(cli.root, "train-eval")
    train, evals, export = (one(cli.root, n) for n in ("train", "eval", "export"))
    cli.answer(squeue="500|RUNNING|None|node1\n501|PENDING|Dependency|\n502|PENDING|Dependency|\n")
    proc = cli("status")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "run                                  job          state    nodes  step  ckpt  "
        "attempts  note\n"
        f"{pipeline.name}  500,501,502  RUNNING  -         -     -         -  pipeline of 3: "
        f"train RUNNING, eval PENDING, export PENDING (ddlaunch status {pipeline.name})\n"
    )
    # By id or a unique prefix of it: the stages' own rows, in the pipeline's order.
    for ref in (pipeline.name, pipeline.name[:12], str(pipeline)):
        proc = cli("status", ref)
        assert (proc.returncode, proc.stderr) == (0, ""), ref
        assert proc.stdout == (
            "run                              job  state    nodes  step  ckpt  attempts  note\n"
            f"{train.name}   500  RUNNING  node1     -     -         0\n"
            f"{evals.name}    501  PENDING  -         -     -         0  waiting for "
            f"{train.name} (job 500) to complete\n"
            f"{export.name}  502  PENDING  -         -     -         0  waiting for "
            f"{train.name} (job 500) to end\n"
        ), ref
    # A prefix that is also a run's stays the run's.
    proc = cli("status", train.name[:10])
    assert proc.stdout.splitlines()[1:] == [
        f"{train.name}  500  RUNNING  node1     -     -         0"
    ]


def test_cancel_of_a_pipeline_cancels_every_stage_in_one_scancel(cli: Cli) -> None:
    cli.number_jobs(500)
    cli.answer(squeue="500|PENDING|Priority|\n")
    assert cli("pipeline", "chain.yaml").returncode == 0
    pipeline = one(cli.root, "train-eval")
    train, evals, export = (one(cli.root, n) for n in ("train", "eval", "export"))
    cli.answer(squeue="500|RUNNING|None|node1\n501|PENDING|Dependency|\n502|PENDING|Dependency|\n")
    cli.forget_calls()
    proc = cli("cancel", pipeline.name)
    assert (proc.returncode, proc.stdout) == (
        0,
        f"{train.name}: cancelled job 500: cancelled before it started\n"
        f"{evals.name}: cancelled job 501: cancelled before it started\n"
        f"{export.name}: cancelled job 502: cancelled before it started\n",
    )
    assert cli.calls("scancel") == ["scancel 500 501 502"]


def test_a_refused_stage_stops_the_pipeline_and_says_what_was_submitted(cli: Cli) -> None:
    cli.number_jobs(600, refuse=601)
    cli.answer(squeue="600|PENDING|Priority|\n")
    proc = cli("pipeline", "chain.yaml")
    pipeline = one(cli.root, "train-eval")
    train, evals = one(cli.root, "train"), one(cli.root, "eval")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        f"pipeline {pipeline.name}: 3 stages\n"
        f"pipeline dir: {pipeline}\n"
        f"stage train   run {train.name}  job 600\n",
        "error: stage eval was not submitted: sbatch failed (exit 1): sbatch: error: Batch "
        "job submission failed: Invalid account or account/partition combination specified\n"
        f"submitted before it, and still queued: train (run {train.name}, job 600)\n"
        "not submitted: eval, export\n"
        f"cancel what was submitted with: ddlaunch cancel {pipeline.name}\n",
    )
    assert not list(cli.root.glob("export-*"))
    record = json.loads((pipeline / "pipeline.json").read_text())
    assert [(s["name"], s.get("run_dir"), s.get("job_id")) for s in record["stages"]] == [
        ("train", str(train), "600"),
        ("eval", str(evals), None),  # its run directory keeps sbatch's error
        ("export", None, None),
    ]
    cli.answer(squeue="600|PENDING|Priority|\n")
    proc = cli("status")
    assert proc.stdout.splitlines()[1:] == [
        f"{pipeline.name}  600  PENDING  -         -     -         -  pipeline of 3: train "
        f"PENDING, eval SUBMIT_FAILED, export NOT SUBMITTED (ddlaunch status {pipeline.name})"
    ]


def test_a_stage_whose_config_does_not_load_submits_nothing(cli: Cli) -> None:
    (cli.tmp / "chain.yaml").write_text(
        PIPELINE.replace("after: train:any\n", "after: train:any\n    set: {nodes.count: x}\n")
    )
    cli.number_jobs(500)
    proc = cli("pipeline", "chain.yaml")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "error: invalid pipeline file (1 error):\n"
        "  stages.export: nodes.count: expected an integer, got str 'x' (chain.yaml:12)\n",
    )
    assert cli.calls("sbatch", "squeue") == [] and not cli.root.exists()


def test_a_dry_run_checks_everything_and_prints_the_order(cli: Cli) -> None:
    proc = cli("pipeline", "chain.yaml", "--dry-run")
    mlp = Path(__file__).parent.parent / "ddlaunch" / "configs" / "examples" / "mlp.yaml"
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "pipeline train-eval: 3 stages, submitted in this order\n"
        f"stage train: {mlp.resolve()} --set job.name=train --set params.steps=40\n"
        "  after: -\n"
        f"stage eval: {mlp.resolve()} --set job.name=eval\n"
        "  after: train:ok\n"
        f"stage export: {mlp.resolve()} --set job.name=export\n"
        "  after: train:any\n"
        "# nothing submitted (--dry-run)\n",
        "",
    )
    assert cli.calls("sbatch", "squeue", "sinfo") == [] and not cli.root.exists()


def test_every_mistake_of_the_file_is_reported_in_one_error(cli: Cli) -> None:
    (cli.tmp / "chain.yaml").write_text(
        "name: train-eval\n"
        "stages:\n"
        "  train:\n"
        "    config: examples/mlp\n"
        "    set: {params.steps: 40}\n"
        "    retries: 2\n"
        "  eval:\n"
        "    config: examples/mlp\n"
        "    set: {nodes.count: x}\n"
        "    after: [train, ghost]\n"
        "  a:\n"
        "    config: examples/mlp\n"
        "    after: b\n"
        "  b:\n"
        "    config: examples/mlp\n"
        "    after: a\n"
    )
    for dry_run in ([], ["--dry-run"]):
        proc = cli("pipeline", "chain.yaml", "--set", "params.lr=0.1", *dry_run)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            2,
            "",
            "error: invalid pipeline file (4 errors):\n"
            "  stages.train.retries: unknown key (expected one of: config, set, after) "
            "(chain.yaml:6)\n"
            "  stages.eval.after: no stage 'ghost' (stages: train, eval, a, b) (chain.yaml:10)\n"
            "  stages: the after: edges make a cycle among a, b (chain.yaml:2)\n"
            "  stages.eval: nodes.count: expected an integer, got str 'x' (chain.yaml:9)\n",
        ), dry_run
    assert cli.calls("sbatch", "squeue") == [] and not cli.root.exists()


def test_set_applies_to_every_stage_after_its_own_set(cli: Cli) -> None:
    sets = ("--set", "params.steps=7", "--set", "params.lr=0.1")
    proc = cli("pipeline", "chain.yaml", "--dry-run", *sets)
    mlp = (
        Path(__file__).parent.parent / "ddlaunch" / "configs" / "examples" / "mlp.yaml"
    ).resolve()
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "pipeline train-eval: 3 stages, submitted in this order\n"
        f"stage train: {mlp} --set job.name=train --set params.steps=40 --set params.steps=7 "
        "--set params.lr=0.1\n"
        "  after: -\n"
        f"stage eval: {mlp} --set job.name=eval --set params.steps=7 --set params.lr=0.1\n"
        "  after: train:ok\n"
        f"stage export: {mlp} --set job.name=export --set params.steps=7 --set params.lr=0.1\n"
        "  after: train:any\n"
        "# nothing submitted (--dry-run)\n",
        "",
    )
    # Submitted: the command line wins over a stage's own set: (train's params.steps: 40).
    cli.number_jobs(500)
    cli.answer(squeue="500|PENDING|Priority|\n")
    assert cli("pipeline", "chain.yaml", *sets).returncode == 0
    for name in ("train", "eval", "export"):
        resolved = (one(cli.root, name) / "config.yaml").read_text()
        assert "  steps: 7\n" in resolved and "  lr: 0.1\n" in resolved, name
    record = json.loads((one(cli.root, "train-eval") / "pipeline.json").read_text())
    assert [s["overrides"] for s in record["stages"]] == [
        ["job.name=train", "params.steps=40", "params.steps=7", "params.lr=0.1"],
        ["job.name=eval", "params.steps=7", "params.lr=0.1"],
        ["job.name=export", "params.steps=7", "params.lr=0.1"],
    ]
