"""My latest run is the run submitted last (``app.runs.list_runs``), never the run directory
written last: ``report`` writing into an old run, or its logs growing, must not make it the
run ``doctor`` checks against. Directory mtimes are set with ``os.utime``, so nothing here
depends on the clock's resolution."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from support.fakes import FakeRunner, ok
from support.rundirs import T0, make_run

from ddlaunch.app import runs
from ddlaunch.app.doctor import config_source, run_doctor
from ddlaunch.app.prepare import prepare
from ddlaunch.app.runs import list_runs
from ddlaunch.config.validate import to_plain
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, submission
from ddlaunch.store.rundir import SCRIPT_FILE


def _at(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def _mlp_config(tmp_path: Path, *sets: str) -> str:
    """examples/mlp resolved (``sets`` applied) as submit writes a run's config.yaml."""
    cfg = prepare("examples/mlp", list(sets), run_root=str(tmp_path), workdir=str(tmp_path)).config
    return yaml.safe_dump(to_plain(cfg), sort_keys=False)


def _old_run_reported_on_after_the_new_one(root: Path, old_config: str, new_config: str) -> None:
    """``old`` submitted at T0, ``new`` a minute later; then ``ddlaunch report old`` wrote its
    files into ``old``, whose directory is now the one changed last."""
    old = make_run(root, "old", "100", T0, config=old_config)
    new = make_run(root, "new", "101", T0 + 60, config=new_config)
    (old / "report.html").write_text("<html></html>")
    _at(new, T0 + 61)
    _at(old, T0 + 3600)


def test_the_latest_run_is_the_one_submitted_last_not_the_one_written_last(
    tmp_path: Path,
) -> None:
    _old_run_reported_on_after_the_new_one(tmp_path, "job: {name: old}\n", "job: {name: new}\n")
    assert [p.name for p in list_runs(tmp_path)] == ["old", "new"]


def test_runs_without_a_recorded_submission_time_sort_by_what_they_have(tmp_path: Path) -> None:
    """Submitted: submission.json's time (a resume rewrites it: a resumed run is submitted
    again); a submit cut short before sbatch answered: its intent's; a local run: its
    config's mtime; a directory with nothing but its script: first; equal times by id.
    Every directory's own mtime says the opposite order."""
    make_run(tmp_path, "resumed", ("1", "2"), T0 + 50)  # first submitted long before
    make_run(tmp_path, "submitted", "3", T0 + 10)
    make_run(tmp_path, "cut-short", None, T0 + 20)  # intent.json only
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.yaml").write_text("job: {name: local}\n")
    _at(local / "config.yaml", T0 + 30)
    scripted = tmp_path / "scripted"  # lost its config: still a run (is_run_dir)
    scripted.mkdir()
    (scripted / SCRIPT_FILE).write_text("#!/bin/bash\n")
    make_run(tmp_path, "tie-b", "5", T0 + 60)
    make_run(tmp_path, "tie-a", "4", T0 + 60)
    (tmp_path / "notes").mkdir()  # not a run: no config, no script
    order = ["scripted", "submitted", "cut-short", "local", "resumed", "tie-a", "tie-b"]
    for i, name in enumerate(order):
        _at(tmp_path / name, T0 + 1000 - i)
    assert [p.name for p in list_runs(tmp_path)] == order


def test_a_submitted_run_costs_its_submission_record_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of runs under one root: a run whose submission time is recorded is not
    read further (no intent, no attempts)."""
    make_run(tmp_path, "a", "1", T0)
    make_run(tmp_path, "b", "2", T0 + 1)

    def unexpected(run_dir: Path) -> None:
        raise AssertionError(f"read more than submission.json of {run_dir.name}")

    monkeypatch.setattr(submission, "read_intent", unexpected)
    monkeypatch.setattr(attempts, "load", unexpected)
    assert [p.name for p in list_runs(tmp_path)] == ["a", "b"]
    assert runs.submitted_at(tmp_path / "b") == T0 + 1


def test_doctor_without_a_config_checks_against_the_run_submitted_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    old_config = _mlp_config(tmp_path, "health.min_free_gb=3")
    new_config = _mlp_config(tmp_path, "health.min_free_gb=7")
    _old_run_reported_on_after_the_new_one(tmp_path, old_config, new_config)
    assert config_source(None) == str(tmp_path / "new" / "config.yaml")

    runner = FakeRunner({("sbatch",): ok("64\n"), ("squeue",): ok("64|PENDING|Priority|\n")})
    said: list[str] = []

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt  # submitted: what it checks against is all this test needs

    with pytest.raises(KeyboardInterrupt):
        run_doctor(
            None, [], count=1, nodelist=None, timeout=900, client=SlurmClient(runner),
            sleep=interrupt, tell=said.append,
        )  # fmt: skip
    assert said[0] == "checking against the config of my latest run, new"
    (checked,) = (tmp_path / "doctor").iterdir()
    assert yaml.safe_load((checked / "config.yaml").read_text())["health"]["min_free_gb"] == 7


def test_status_lists_last_the_run_doctor_takes_as_my_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` (newest at the bottom) and ``doctor``'s default agree on which run is the
    latest, whichever directory was written last."""
    from ddlaunch.app.status_poll import collect

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path))
    _old_run_reported_on_after_the_new_one(tmp_path, "job: {name: old}\n", "job: {name: new}\n")
    runner = FakeRunner({"squeue": ok("100|RUNNING|None|node1\n101|RUNNING|None|node2\n")})
    shown = [row.run_id for row in collect((), runner)]
    assert shown == [p.name for p in list_runs()] == ["old", "new"]
