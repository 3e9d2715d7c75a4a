"""``--run-root`` as given on the command line: the batch script runs in
``launch.workdir``, not where ``submit`` ran, so a relative run root must reach it absolute
(a relative one made the job fail before its batch log could be opened, with no record)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare_submission


@pytest.mark.parametrize("given", ["rr", "./rr", "$HERE_ROOT/rr"])
def test_a_relative_run_root_reaches_the_script_and_sbatch_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HERE_ROOT", ".")
    workdir = tmp_path / "wd"
    workdir.mkdir()
    sub = prepare_submission(
        "examples/mlp",
        [f"launch.workdir={workdir}"],
        run_root=given,
        run_id="t",
        snapshot="off",
    )
    run_dir = tmp_path / "rr" / "t"
    line = sub.prepared.sbatch_line
    assert f"--output={run_dir}/logs/batch-%j.out" in line
    assert f"--chdir={workdir}" in line
    assert f"export DDLAUNCH_RUN_DIR={run_dir}\n" in sub.prepared.script


def test_a_sweeps_relative_run_root_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.sweeps.prepare import prepare_sweep
    from ddlaunch.sweeps.spec import parse_sweep_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("base: examples/mlp\ngrid:\n  params.lr: [0.1, 0.2]\n")
    prepared = prepare_sweep(parse_sweep_file("s.yaml"), workdir=str(tmp_path), run_root="rr")
    assert prepared.sweep_dir == tmp_path / "rr" / prepared.sweep_id
