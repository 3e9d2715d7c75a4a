"""The sweep file: axes, overrides, errors with file:line, shipped sweeps, array splits."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sweeps import sweep_file, write

from ddlaunch.config.load import parse_yaml_value
from ddlaunch.sweeps.prepare import prepare_sweep
from ddlaunch.sweeps.spec import (
    SweepFileError,
    expand,
    format_value,
    parse_sweep_file,
    split_arrays,
)

REPO = Path(__file__).resolve().parent.parent


def test_axes_multiply_in_file_order_last_fastest(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path,
        "grid:\n  params.lr: [0.1, 0.2]\n"
        "zip:\n  params.a: [1, 2, 3]\n  params.b: [x, y, z]\n"
        "list:\n  - {params.c: 1}\n  - [params.c=2, params.d=true]\n"
        "seeds: 2\n",
    )
    spec = parse_sweep_file(path)
    members = expand(spec)
    assert spec.size == len(members) == 2 * 3 * 2 * 2
    assert members[0].label == "params.lr=0.1 params.a=1 params.b=x params.c=1 params.seed=0"
    assert members[1].label == "params.lr=0.1 params.a=1 params.b=x params.c=1 params.seed=1"
    assert members[2].set_args[-3:] == ["params.c=2", "params.d=true", "params.seed=0"]
    assert (
        members[-1].label
        == "params.lr=0.2 params.a=3 params.b=z params.c=2 params.d=true params.seed=1"
    )
    assert [m.index for m in members] == list(range(24))


def test_set_forms_and_cli_set_join_common_overrides(tmp_path: Path, base: Path) -> None:
    spec = parse_sweep_file(
        sweep_file(tmp_path, "set: {params.steps: 5}\nseeds: [3, 7]\nseed_key: params.s\n"),
        extra_set=["job.time=00:02:00"],
    )
    assert spec.common == ("params.steps=5", "job.time=00:02:00")
    assert [m.label for m in expand(spec)] == ["params.s=3", "params.s=7"]


@pytest.mark.parametrize(
    "value",
    [0.01, 3e-4, 1e-10, 5, True, None, "3e-4", "1:30:00", "yes", "a b", "a=b", [1, "x"], {"k": 2}],
)
def test_override_text_types_back_like_set(value: object) -> None:
    text = format_value(value)
    again = parse_yaml_value(text)
    assert again == value and type(again) is type(value), text


def test_a_value_with_equals_is_quoted_where_set_would_refuse_it(
    tmp_path: Path, base: Path
) -> None:
    """A sweep's values become --set texts: one with '=' is written quoted (--set refuses an
    unquoted one under params), and a key=value entry of the file is held to --set's rule."""
    spec = parse_sweep_file(sweep_file(tmp_path, 'grid:\n  params.opt: ["adam=1", sgd]\n'))
    assert [m.label for m in expand(spec)] == ['params.opt="adam=1"', "params.opt=sgd"]
    prepared = prepare_sweep(spec, workdir="/w", run_root=str(tmp_path), sweep_id="s")
    assert [c.params["opt"] for c in prepared.configs] == ["adam=1", "sgd"]
    path = sweep_file(tmp_path, "set: [params.opt=adam=1]\nseeds: 2\n")
    with pytest.raises(SweepFileError) as err:
        parse_sweep_file(path)
    assert str(err.value) == (
        "invalid sweep file (1 error):\n"
        "  set: params.opt: got 'adam=1', with an unquoted '=' (params reach the training code "
        f"unchecked); if the '=' is meant, quote the value: params.opt=\"adam=1\" ({path}:2)"
    )
    quoted = parse_sweep_file(sweep_file(tmp_path, "set: ['params.opt=\"adam=1\"']\nseeds: 2\n"))
    assert quoted.common == ('params.opt="adam=1"',)


def test_sweep_file_errors_name_file_line_and_key(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path,
        "grid:\n  params.lr: [0.1]\n  params.a: 3\n"
        "zip:\n  params.b: [1, 2]\n  params.c: [1]\n"
        "seeds: 2\nseed_key: params.lr\n"
        "nodes: {count: 2}\nthrottle: 0\n",
    )
    with pytest.raises(SweepFileError) as err:
        parse_sweep_file(path)
    text = str(err.value)
    assert text.startswith("invalid sweep file (5 errors):")
    assert "grid.params.a: expected a non-empty list of values, e.g. [0.01, 0.1] (" in text
    assert "sweep.yaml:4)" in text
    assert "zip: zipped lists must have the same length (params.b: 2, params.c: 1)" in text
    assert "seeds: swept by both grid.params.lr and seeds; sweep each key in one axis" in text
    assert "nodes: unknown sweep key; config keys belong in the base config (or in set:)" in text
    assert "throttle: must be a positive integer, got 0" in text


def test_missing_base_duplicates_and_no_axis_are_refused(tmp_path: Path, base: Path) -> None:
    write(tmp_path / "nobase.yaml", "base: nowhere.yaml\nseeds: 2\n")
    with pytest.raises(SweepFileError, match=r"base: config 'nowhere\.yaml' not found"):
        parse_sweep_file(tmp_path / "nobase.yaml")
    with pytest.raises(SweepFileError, match="members 0 and 1 have the same overrides"):
        parse_sweep_file(sweep_file(tmp_path, "list: [{params.x: 1}, [params.x=1]]\n"))
    with pytest.raises(SweepFileError, match="needs at least one axis"):
        parse_sweep_file(sweep_file(tmp_path, "set: [params.x=1]\n"))


def test_shipped_sweeps_parse_and_validate(tmp_path: Path) -> None:
    for path in sorted((REPO / "ddlaunch" / "configs" / "sweeps").glob("*.yaml")):
        spec = parse_sweep_file(path)
        prepared = prepare_sweep(spec, workdir="/w", run_root=str(tmp_path), sweep_id="s")
        assert len(prepared.members) == spec.size > 1
        assert len(prepared.arrays) == 1


def test_split_arrays() -> None:
    assert split_arrays(list(range(5)), 2) == [(0, 1), (2, 3), (4,)]
    assert split_arrays(list(range(5)), None) == [(0, 1, 2, 3, 4)]
    assert split_arrays([3, 9], 101) == [(3, 9)]


def test_a_set_on_a_swept_key_is_refused_naming_both_places(tmp_path: Path, base: Path) -> None:
    # Each member's axis value would replace the --set: member 1 would run with 5.
    path = sweep_file(tmp_path, "grid:\n  params.crash_at: [-1, 5]\n")
    with pytest.raises(SweepFileError) as err:
        parse_sweep_file(path, extra_set=["params.crash_at=-1"])
    assert str(err.value) == (
        "invalid sweep file (1 error):\n"
        "  params.crash_at: --set params.crash_at=-1 is swept by grid.params.crash_at too, "
        "whose values would replace it in every member; drop the --set, or remove the axis "
        f"from the sweep file ({path}:3)"
    )
    # The sweep file's own set: names its line; a zip, the list and the seeds as well.
    path = sweep_file(
        tmp_path,
        "set: [params.lr=0.1, params.steps=5]\n"
        "zip:\n  params.lr: [1, 2]\n  params.b: [1, 2]\n"
        "list:\n  - {params.steps: 9}\n"
        "seeds: 2\n",
    )
    with pytest.raises(SweepFileError) as err:
        parse_sweep_file(path, extra_set=["params.seed=3"])
    assert str(err.value).splitlines() == [
        "invalid sweep file (3 errors):",
        f"  params.lr: set: params.lr=0.1 ({path}:2) is swept by zip too, whose values would "
        f"replace it in every member; drop it from set:, or remove the axis ({path}:4)",
        f"  params.steps: set: params.steps=5 ({path}:2) is swept by list too, whose values "
        f"would replace it in every member; drop it from set:, or remove the axis ({path}:6)",
        "  params.seed: --set params.seed=3 is swept by seeds too, whose values would replace "
        f"it in every member; drop the --set, or remove the axis from the sweep file ({path}:8)",
    ]


def test_a_set_inside_a_swept_mapping_is_refused_one_around_it_is_not(
    tmp_path: Path, base: Path
) -> None:
    path = sweep_file(tmp_path, "grid:\n  params.opt: [{lr: 1}, {lr: 2}]\n")
    # The axis replaces params.opt whole: the --set's params.opt.momentum would be lost.
    with pytest.raises(SweepFileError, match=r"params\.opt\.momentum: --set params\.opt\."):
        parse_sweep_file(path, extra_set=["params.opt.momentum=0.9"])
    # A --set of the mapping around an axis' key is completed by the axis, not replaced.
    spec = parse_sweep_file(path, extra_set=["params={steps: 3}"])
    assert spec.common == ("params={steps: 3}",)


def test_a_cli_set_over_the_files_set_replaces_it(tmp_path: Path, base: Path) -> None:
    path = sweep_file(tmp_path, "set: [params.steps=5]\nseeds: 2\n")
    spec = parse_sweep_file(path, extra_set=["params.steps=7"])
    assert spec.common == ("params.steps=5", "params.steps=7")  # applied in order: 7


def test_a_set_some_list_entries_override_is_the_others_value(tmp_path: Path, base: Path) -> None:
    # The worked example of the docs: steps 200 for every member but the first entry's.
    path = sweep_file(
        tmp_path,
        "set: [params.steps=200]\n"
        "list:\n  - {params.momentum: 0.9, params.steps: 400}\n  - [params.momentum=0.0]\n",
    )
    for extra in ((), ("params.steps=300",)):
        spec = parse_sweep_file(path, extra_set=extra)
        assert spec.common == ("params.steps=200", *extra)
        labels = [m.label for m in expand(spec)]
        assert labels == ["params.momentum=0.9 params.steps=400", "params.momentum=0.0"]
