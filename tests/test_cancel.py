"""``ddlaunch cancel`` tells the truth (#20): a finished run is left alone, every reference is
checked before anything is cancelled, a job killed before anyone concluded it is concluded by
``cancel`` once it is gone, a sweep is cancelled as a whole, and a member that has not started
gets no run directory. Recorded Slurm output through the one fake runner; the real behaviour
(signals, KillWait, accounting) is in ``test_cancel_slurm.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes import FakeRunner, ok
from support.rundirs import T0, make_run
from support.sweeps import sbatch_ids, start, submitted_sweep

from ddlaunch.app.cancel import cancel
from ddlaunch.app.status_poll import collect
from ddlaunch.errors import UserError
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.members import materialize


def cancel_cli(ref: str, bin_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``ddlaunch cancel REF`` as a user runs it, with the stand-in Slurm commands first on
    the PATH."""
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", "cancel", ref],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NO_COLOR": "1"},
        cwd=cwd,
        check=False,
        timeout=60,
    )


class Cluster(FakeRunner):
    """squeue answers ``before`` until scancel ran, then ``after`` (the jobs left)."""

    def __init__(self, before: str, after: str = "", sacct: str = "") -> None:
        self.cancelled = False
        super().__init__(on_run=self._answer)
        self.before, self.after, self.sacct = before, after, sacct

    def _answer(self, argv: list[str]):  # type: ignore[no-untyped-def]
        if argv[0] == "scancel":
            self.cancelled = True
            return ok()
        if argv[0] == "squeue":
            return ok(self.after if self.cancelled else self.before)
        if argv[0] == "sacct":
            return ok(self.sacct)
        return ok()

    def scancels(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "scancel"]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_a_finished_run_is_left_alone(root: Path) -> None:
    done = make_run(root, "done", "357", T0, outcome=("COMPLETED",))
    slurm = Cluster("357|COMPLETED|None|node1\n")
    assert cancel(["done"], SlurmClient(slurm)) == [
        "done: already finished (COMPLETED); nothing to cancel"
    ]
    assert not (done / "cancel.json").exists() and slurm.scancels() == []
    make_run(root, "again", "358", T0, outcome=("CANCELLED", "cancelled, saved step 40"))
    slurm = Cluster("358|CANCELLED|None|node1\n")
    assert cancel(["again"], SlurmClient(slurm)) == ["again: already cancelled; nothing to do"]
    assert slurm.scancels() == []


def test_every_reference_is_checked_before_anything_is_cancelled(root: Path) -> None:
    live = make_run(root, "live", "7", T0)
    slurm = Cluster("7|RUNNING|None|node1\n")
    with pytest.raises(UserError, match="no run 'nope'"):
        cancel(["live", "nope"], SlurmClient(slurm))
    assert slurm.scancels() == [] and not (live / "cancel.json").exists()


def test_a_job_killed_before_anyone_concluded_it_is_concluded_by_cancel(root: Path) -> None:
    """Cancelled 2 s after its start: the ranks were importing torch, no step boundary came,
    SIGKILL followed SIGTERM, the batch shell never reached its end hook."""
    attempt = {"attempt": 0, "job_id": "7", "nodes": "node1", "start": T0, "resumed_from": None}
    run = make_run(root, "early", "7", T0, attempts=[attempt])
    slurm = Cluster("7|RUNNING|None|node1\n", after="7|CANCELLED|None|node1\n")
    assert cancel(["early"], SlurmClient(slurm), wait_s=5) == [
        "early: cancelled job 7: cancelled before any checkpoint"
    ]
    assert slurm.scancels() == [["scancel", "7"]]
    (record,) = json.loads((run / "attempts.json").read_text())
    assert record["cause"] == "cancelled" and "end" in record
    outcome = json.loads((run / "outcome.json").read_text())
    assert (outcome["state"], outcome["reason"]) == ("CANCELLED", "cancelled before any checkpoint")
    # A pending one never started at all.
    make_run(root, "queued", "8", T0)
    slurm = Cluster("8|PENDING|Priority|\n")
    assert cancel(["queued"], SlurmClient(slurm)) == [
        "queued: cancelled job 8: cancelled before it started"
    ]


@pytest.mark.parametrize("closed", [True, False], ids=["concluded", "cut-off"])
def test_a_cancel_never_rewrites_the_node_failure_an_attempt_ended_in(
    root: Path, closed: bool
) -> None:
    """Attempt 0 ended in a node failure and its requeue was pending when the user
    cancelled: concluded by the end hook (closed, requeue decided), or cut off by the guard
    (the batch host lost, open until the next start). The attempt keeps its node failure;
    the cancel is the run's outcome and what happened to the pending requeue."""
    guard = "requeued by ddlaunch's guard: batch host node4 down"
    attempt = {"attempt": 0, "job_id": "7", "nodes": "node[2-4]", "start": T0}
    if closed:
        decided = "requeue after node failure: committed step none -> 60"
        attempt |= {"end": T0 + 60, "cause": "node failure", "blamed": ["node4"],
                    "decision": decided}  # fmt: skip
    else:
        attempt |= {"guard": guard, "dead_nodes": ["node4"]}
    run = make_run(root, "lost", "7", T0, attempts=[attempt], ckpt=[60])
    slurm = Cluster("7|PENDING|BadConstraints|\n", after="7|CANCELLED|None|\n")
    reason = "cancelled while its requeue was pending, last checkpoint step 60"
    lines = cancel(["lost"], SlurmClient(slurm), wait_s=5)
    (record,) = json.loads((run / "attempts.json").read_text())
    if closed:
        assert (record["cause"], record["end"]) == ("node failure", T0 + 60)
        assert record["decision"] == attempt["decision"]
    else:
        assert (record["cause"], record["decision"]) == ("requeued by Slurm", guard)
    assert record["blamed"] == ["node4"] and record["then"] == reason
    assert lines == [f"lost: cancelled job 7: {reason}"]
    outcome = json.loads((run / "outcome.json").read_text())
    assert (outcome["state"], outcome["reason"]) == ("CANCELLED", reason)


def test_rank0_s_conclusion_is_kept(root: Path) -> None:
    """The ranks saved on the SIGTERM and rank 0 recorded the outcome: cancel reports it."""
    run = make_run(root, "saved", "9", T0, attempts=[{"attempt": 0, "start": T0}])
    slurm = Cluster("9|RUNNING|None|node1\n")

    def rank0_concludes(argv: list[str]):  # type: ignore[no-untyped-def]
        if argv[0] == "scancel":
            (run / "outcome.json").write_text(
                json.dumps({"state": "CANCELLED", "reason": "cancelled, saved step 766"})
            )
        return slurm._answer(argv)

    slurm.on_run = rank0_concludes
    assert cancel(["saved"], SlurmClient(slurm)) == [
        "saved: cancelled job 9: cancelled, saved step 766"
    ]


def test_a_sweep_is_cancelled_as_a_whole_without_creating_member_dirs(root: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("374", "380"), ("git",): ok()})
    prepared, _ = submitted_sweep(root.parent, runner, members=5, max_size=3)
    members = prepared.sweep_dir / "members"
    start(members / "0", "374_0")
    queue = (
        "374_0|RUNNING|None|node1\n374_1|PENDING|JobArrayTaskLimit|\n"
        "374_2|PENDING|JobArrayTaskLimit|\n380_0|PENDING|Priority|\n380_1|PENDING|Priority|\n"
    )
    slurm = Cluster(queue)
    # One member first, by the id status prints: it has not started, so it gets no directory.
    assert cancel(["sw/3"], SlurmClient(slurm)) == ["sw/3: cancelled job 380_0 before it started"]
    assert slurm.scancels() == [["scancel", "380_0"]] and not (members / "3").exists()
    slurm = Cluster(queue.replace("380_0|PENDING|Priority|\n", "380_0|CANCELLED|None|\n"))
    assert cancel(["sw"], SlurmClient(slurm)) == [
        "sw: cancelled 4 members (3 pending, 1 running; arrays 374, 380); 1 had ended already"
    ]
    assert slurm.scancels() == [["scancel", "374", "380"]]
    assert sorted(p.name for p in members.iterdir() if not p.name.startswith(".")) == ["0"]
    # Long after (the controller forgot the jobs, no accounting): every member stays CANCELLED.
    rows = collect(("sw",), Cluster("", sacct=""))
    assert [(r.run_id, r.state) for r in rows] == [(f"sw/{i}", "CANCELLED") for i in range(5)]
    # A task that started in the instant before scancel finds its cancel in its new directory.
    assert (materialize(prepared.sweep_dir, 2, "374_2", "0") / "cancel.json").is_file()


def test_a_unique_prefix_of_a_sweep_id_cancels_the_whole_sweep(root: Path) -> None:
    """#31: ``cancel PREFIX`` of a sweep's id cancelled member 0 only and left the others
    queued. A prefix names the sweep, as ``status`` takes it: the whole CLI output, recorded
    squeue output through the stand-in Slurm commands."""

    from support.fakes import fake_slurm_bin, slurm_calls

    runner = FakeRunner({("sbatch",): sbatch_ids("387"), ("git",): ok()})
    prepared, _ = submitted_sweep(root.parent, runner, members=4, max_size=4)
    start(prepared.sweep_dir / "members" / "0", "387_0")
    make_run(root, "mlp-run", "390", T0)  # another run: the prefix must still be unique
    queue = (
        "387_0|RUNNING|None|node1\n387_1|PENDING|JobArrayTaskLimit|\n"
        "387_2|PENDING|JobArrayTaskLimit|\n387_3|PENDING|JobArrayTaskLimit|\n"
        "390|RUNNING|None|node2\n"
    )
    bin_dir = fake_slurm_bin(root.parent / "bin", after_scancel={"squeue": ""}, squeue=queue)
    proc = cancel_cli("s", bin_dir, root.parent)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "sw: cancelled 4 members (3 pending, 1 running; array 387)\n",
        "waiting for job 387_0 to stop (the ranks save first) and 3 jobs to leave the queue...\n",
    )
    assert [c for c in slurm_calls(bin_dir) if c.startswith("scancel")] == ["scancel 387"]
    assert not (root / "mlp-run" / "cancel.json").exists()


def test_a_prefix_of_a_sweep_and_a_run_is_refused_and_cancels_nothing(root: Path) -> None:
    """``cancel s`` where ``s`` begins both the sweep ``sw`` and the run ``sx-run``: the
    prefix is unique among neither, so it names neither; cancelling the whole sweep (or the
    run) on a guess would stop jobs the user did not mean. The whole CLI output, recorded
    squeue output through the stand-in Slurm commands."""

    from support.fakes import fake_slurm_bin, slurm_calls

    runner = FakeRunner({("sbatch",): sbatch_ids("387"), ("git",): ok()})
    prepared, _ = submitted_sweep(root.parent, runner, members=2, max_size=4)
    run = make_run(root, "sx-run", "390", T0)
    queue = "387_0|PENDING|Priority|\n387_1|PENDING|Priority|\n390|RUNNING|None|node2\n"
    bin_dir = fake_slurm_bin(root.parent / "bin", after_scancel={"squeue": ""}, squeue=queue)
    proc = cancel_cli("s", bin_dir, root.parent)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "error: 's' matches 1 sweep and 1 run (sw, sx-run); give more of the id\n",
    )
    assert slurm_calls(bin_dir) == []
    assert not (run / "cancel.json").exists()
    assert not (prepared.sweep_dir / "cancelled.json").exists()


def test_a_prefix_of_two_sweeps_never_falls_back_to_the_one_run_it_also_begins(
    root: Path,
) -> None:
    """Two sweeps and a run under one prefix: ``status`` and ``cancel`` resolve it alike
    (``status_poll.resolve``), and the run, the only one of its kind, is not taken for it."""
    import shutil

    from ddlaunch.app.status_poll import resolve

    runner = FakeRunner({("sbatch",): sbatch_ids("387"), ("git",): ok()})
    prepared, _ = submitted_sweep(root.parent, runner, members=2, max_size=4)
    shutil.copytree(prepared.sweep_dir, root / "sv")
    make_run(root, "sx-run", "390", T0)
    with pytest.raises(UserError) as refused:
        resolve(["s"], root)
    assert str(refused.value) == (
        "'s' matches 2 sweeps and 1 run (sv, sw, sx-run); give more of the id"
    )
    slurm = Cluster("387_0|PENDING|Priority|\n387_1|PENDING|Priority|\n390|RUNNING|None|n2\n")
    with pytest.raises(UserError, match="matches 2 sweeps and 1 run"):
        cancel(["s"], SlurmClient(slurm))
    assert slurm.scancels() == []
    # Given more of the id, each names its own again.
    assert [t.path.name for t in resolve(["sw"], root)[0]] == ["0", "1"]
    assert [t.path.name for t in resolve(["sx"], root)[0]] == ["sx-run"]
