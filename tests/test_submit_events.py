"""``submit`` and ``sweep resubmit`` as use cases: the typed events they yield, in order,
for a caller that prints them (the CLI) or reads them (a script)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from ddlaunch.app import events
from ddlaunch.app.submit_run import submit_run
from ddlaunch.errors import UserError
from ddlaunch.store import badnodes
from ddlaunch.sweeps.resubmit import resubmit


def test_a_dry_run_yields_the_exclusion_then_the_script_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no sinfo: nothing is asked
    badnodes.save(badnodes.add([], ["node2"], reason="r", now=1e12, ttl_s=None))
    steps = submit_run(
        "examples/mlp",
        [],
        dry_run=True,
        local=False,
        run_root=None,
        force=False,
        workdir=str(tmp_path),
    )
    seen = list(steps)
    kinds = [type(e).__name__ for e in seen if not isinstance(e, events.Warned)]
    assert kinds == ["Excluding", "CodeSnapshot", "DryRun"]
    assert seen[0] == events.Excluding("excluding node2 (bad-node list: ddlaunch nodes)")
    dry = seen[-1]
    assert isinstance(dry, events.DryRun)
    assert "\n#SBATCH --exclude=node2\n" in dry.script
    assert shlex.split(dry.sbatch_line)[0] == "sbatch"
    assert not (tmp_path / "runs").exists()


def test_resubmit_without_a_choice_is_refused_before_the_sweep_is_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    steps = resubmit(
        "no-such-sweep",
        failed=False,
        cancelled=False,
        members=(),
        overrides=(),
        dry_run=True,
        max_array_size=None,
        hold=False,
        force=False,
    )
    with pytest.raises(UserError) as err:
        next(steps)
    assert str(err.value) == (
        "say which members: --failed, --cancelled, or --member N (repeatable)"
    )
