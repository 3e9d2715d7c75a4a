"""``submit``, ``sweep`` and ``sweep resubmit`` as use cases: the typed events they yield,
in order, for a caller that prints them (the CLI) or reads them (a script)."""

from __future__ import annotations

import os
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


# The recorded sinfo of the dev cluster (22.05): partition debug, node1-3, 4 GPUs each.
SINFO = (
    Path(__file__).resolve().parent / "fixtures" / "slurm-22.05" / "sinfo-partitions.txt"
).read_text()


def _sweep_against_standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grid: str) -> Path:
    """A sweep file over the sweep tests' base, stand-in Slurm commands first on PATH (sinfo
    prints the recorded partitions; sbatch prints no job id, so every array fails) and my
    bad-node list holding node2 and node9 (no node of this cluster)."""
    from support.fakes import fake_slurm_bin
    from support.sweeps import BASE, sweep_file, write

    write(tmp_path / "base.yaml", BASE)
    bin_dir = fake_slurm_bin(tmp_path / "bin", sinfo=SINFO, scontrol="MaxArraySize = 101\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    badnodes.save(badnodes.add([], ["node2", "node9"], reason="r", now=1e12, ttl_s=None))
    return sweep_file(tmp_path, grid)


NOT_NODE9 = (
    "not excluding node9 from the bad-node list: no such node in this cluster "
    "(ddlaunch nodes remove node9)"
)


def test_a_sweep_excludes_my_bad_node_list_as_submit_does_and_so_does_its_resubmission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.sweeps.events import ArraysSubmitted
    from ddlaunch.sweeps.submit_file import submit_sweep_file

    path = _sweep_against_standins(tmp_path, monkeypatch, "grid:\n  params.lr: [1, 2]\n")
    steps = submit_sweep_file(
        str(path),
        [],
        dry_run=False,
        run_root=None,
        max_array_size=None,
        hold=False,
        force=False,
    )
    seen = list(steps)
    assert events.Warned(NOT_NODE9) in seen
    assert events.Excluding("excluding node2 (bad-node list: ddlaunch nodes)") in seen
    (done,) = [e for e in seen if isinstance(e, ArraysSubmitted)]
    script = (done.sweep_dir / "arrays" / "0.sbatch").read_text()
    assert "\n#SBATCH --exclude=node2\n" in script
    assert [o.error for o in done.outcomes] == [
        "could not read a job id from sbatch output: ''"
    ]  # the stand-in sbatch, after the script was written

    # The failed members again: the new array keeps the list out too.
    steps = resubmit(
        str(done.sweep_dir),
        failed=True,
        cancelled=False,
        members=(),
        overrides=(),
        dry_run=False,
        max_array_size=None,
        hold=False,
        force=False,
    )
    seen = list(steps)
    assert events.Warned(NOT_NODE9) in seen
    assert events.Excluding("excluding node2 (bad-node list: ddlaunch nodes)") in seen
    (again,) = [e for e in seen if isinstance(e, ArraysSubmitted)]
    assert [o.members for o in again.outcomes] == [(0, 1)]
    script = (done.sweep_dir / "arrays" / "1.sbatch").read_text()
    assert "\n#SBATCH --exclude=node2\n" in script


def test_a_sweep_member_naming_a_listed_node_uses_it_and_a_shortage_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.app.prepare import Refused
    from ddlaunch.sweeps.events import SweepDryRun
    from ddlaunch.sweeps.submit_file import submit_sweep_file

    grid = "grid:\n  nodes.nodelist: [[], [node2]]\n"
    path = _sweep_against_standins(tmp_path, monkeypatch, grid)
    seen = list(
        submit_sweep_file(
            str(path),
            [],
            dry_run=True,
            run_root=None,
            max_array_size=None,
            hold=False,
            force=False,
        )
    )
    named = "using node2 though on the bad-node list: nodes.nodelist names it (ddlaunch nodes"
    assert events.Warned(f"{named} lists why)") in seen
    (dry,) = [e for e in seen if isinstance(e, SweepDryRun)]
    excluded = {a.spec.members: "--exclude=node2" in a.script for a in dry.arrays}
    assert excluded == {(0,): True, (1,): False}

    # Three nodes each: with node2 listed, partition debug has two. Refused as submit
    # refuses it, naming the listed node, before any sbatch.
    path = _sweep_against_standins(tmp_path, monkeypatch, "grid:\n  params.lr: [1, 2]\n")
    with pytest.raises(Refused) as info:
        list(
            submit_sweep_file(
                str(path),
                ["nodes.count=3"],
                dry_run=False,
                run_root=None,
                max_array_size=None,
                hold=False,
                force=False,
            )
        )
    lines = str(info.value).splitlines()
    assert lines[1] == (
        "  nodes.count: 3 nodes, but partition debug has 3 nodes with 1 GPU or more and 1 of "
        "them is excluded, which leaves 2:"
    )
    assert lines[2].startswith("    node2: on your bad-node list since ")
    assert "sbatch" not in (tmp_path / "bin" / "calls.log").read_text()
