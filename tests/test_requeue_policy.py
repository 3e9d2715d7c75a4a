"""The requeue policy (pure) and the batch-script hooks with an injected fake runner."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ddlaunch import attempts, jobhooks
from ddlaunch.attempts import decide
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient


@pytest.mark.parametrize(
    ("cause", "now", "resumed", "so_far", "cap", "requeue", "reason"),
    [
        ("completed", 300, 0, 0, 3, False, "completed"),
        ("cancelled", 40, 20, 0, 3, False, "cancelled by the user"),
        ("crash", 40, None, 0, 3, True, "requeue after crash: committed step none -> 40"),
        ("crash", 40, 20, 1, 3, True, "requeue after crash: committed step 20 -> 40"),
        (
            "crash",
            40,
            40,
            1,
            3,
            False,
            "stopped: no progress in the last attempt (the committed step stayed at 40)",
        ),
        (
            "crash",
            None,
            None,
            0,
            3,
            False,
            "stopped: no progress in the last attempt (no checkpoint was ever committed)",
        ),
        (
            "crash",
            60,
            40,
            3,
            3,
            False,
            "stopped: 3 requeues reached fault_tolerance.max_requeues=3",
        ),
        ("node failure", 40, 20, 0, 3, True, "requeue after node failure: committed step 20 -> 40"),
        ("signal", 120, 100, 2, 3, True, "requeue after signal: committed step 100 -> 120"),
        (
            "signal",
            120,
            100,
            0,
            0,
            False,
            "stopped: 0 requeues reached fault_tolerance.max_requeues=0",
        ),
    ],
)
def test_decide(cause, now, resumed, so_far, cap, requeue, reason) -> None:
    d = decide(
        cause=cause,
        committed_now=now,
        resumed_from=resumed,
        requeues_so_far=so_far,
        max_requeues=cap,
    )
    assert (d.requeue, d.reason) == (requeue, reason)


class FakeRunner:
    """Replays canned output for commands whose argv starts with a key; records every argv."""

    def __init__(self, outputs: Mapping[str, str]):
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        self.calls.append(list(argv))
        line = " ".join(argv)
        keys = [k for k in self.outputs if line.startswith(k)]
        out = self.outputs[max(keys, key=len)] if keys else ""
        return CommandResult(tuple(argv), 0, out, "")


def make_run(tmp_path: Path, committed: list[int]) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("fault_tolerance: {max_requeues: 3}\n")
    for step in committed:
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir()
        (d / ".metadata").write_text("x")
        (d / ".ddlaunch-commit.json").write_text(
            json.dumps(
                {"format": 1, "step": step, "time": 1.0, "world_size": 4, "num_shard_files": 4}
            )
        )
    return run


def test_start_closes_a_cut_off_attempt_and_blames_down_nodes(tmp_path, monkeypatch) -> None:
    run = make_run(tmp_path, [20, 40])
    attempts.save(
        run,
        [{"attempt": 0, "job_id": "7", "nodes": "node[1-2]", "start": 1.0, "resumed_from": None}],
    )
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1,3]")
    # Recorded from the dev cluster: `sinfo -h -N -o '%N|%T' -n node1,node2` after a node kill.
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|down*\n"})
    jobhooks.start(run, SlurmClient(runner))
    records = attempts.load(run)
    assert records[0]["cause"] == "requeued by Slurm" and records[0]["blamed"] == ["node2"]
    assert records[0]["committed_step"] == 40
    assert records[1] == {
        **records[1],
        "attempt": 1,
        "restart_count": 1,
        "nodes": "node[1,3]",
        "resumed_from": 40,
    }
    assert jobhooks.excluded(run) == ["node2"]
    assert runner.calls == [["sinfo", "-h", "-N", "-o", "%N|%T", "-n", "node1,node2"]]


def test_end_requeues_a_crash_that_made_progress(tmp_path, monkeypatch) -> None:
    run = make_run(tmp_path, [20, 40])
    attempts.save(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": 20}])
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n"})
    assert jobhooks.end(run, 1, SlurmClient(runner), max_requeues=3) == 0
    assert ["scontrol", "requeue", "9"] in runner.calls
    assert attempts.load(run)[0]["cause"] == "crash"
    assert not (run / "outcome.json").exists()


def test_end_stops_a_crash_without_progress(tmp_path, monkeypatch) -> None:
    run = make_run(tmp_path, [20, 40])
    attempts.save(
        run,
        [
            {"attempt": 0, "nodes": "node[1-2]", "resumed_from": None, "end": 1},
            {"attempt": 1, "nodes": "node[1-2]", "resumed_from": 40},
        ],
    )
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n"})
    assert jobhooks.end(run, 1, SlurmClient(runner), max_requeues=3) == 1
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["state"] == "FAILED"
    assert outcome["reason"] == (
        "stopped: no progress in the last attempt (the committed step stayed at 40)"
    )


def test_end_blames_the_node_whose_ranks_died_silently(tmp_path, monkeypatch) -> None:
    run = make_run(tmp_path, [20, 40])
    attempts.save(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": None}])
    (run / "failures").mkdir()
    for rank in (0, 1):  # the ranks on node1 raised (a peer vanished); node2's were killed
        (run / "failures" / f"rank-{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "host": "node1",
                    "job_id": "9",
                    "attempt": 0,
                    "exception": "RuntimeError",
                    "message": "Connection reset by peer",
                }
            )
        )
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    runner = FakeRunner(
        {
            "sinfo": "node1|allocated\nnode2|allocated\n",  # Slurm has not noticed yet
            "scontrol show config": "SlurmdPort              = 1\n",  # nothing listens on port 1
            "scontrol show node -o node2": "NodeName=node2 NodeAddr=127.0.0.1 State=ALLOCATED",
        }
    )
    assert jobhooks.end(run, 137, SlurmClient(runner), max_requeues=3, ranks_per_node=2) == 0
    record = attempts.load(run)[0]
    assert record["cause"] == "node failure" and record["blamed"] == ["node2"]
    assert ["scontrol", "update", "JobId=9", "ExcNodeList=node2"] in runner.calls
    assert runner.calls[-1] == ["scontrol", "requeue", "9"]
    assert not any(c[-1] == "node1" for c in runner.calls if c[:3] == ["scontrol", "show", "node"])


def test_array_tasks_requeue_only_themselves() -> None:
    from ddlaunch.slurm.parse import requeue_target

    # The task that carries the array's own id (SLURM_JOB_ID == SLURM_ARRAY_JOB_ID) must
    # still name itself, or `scontrol requeue` would requeue every task of the array.
    env = {"SLURM_JOB_ID": "480", "SLURM_ARRAY_JOB_ID": "480", "SLURM_ARRAY_TASK_ID": "7"}
    assert requeue_target(env) == "480_7"
    assert requeue_target({"SLURM_JOB_ID": "481"}) == "481"


class _Accounting:
    def __init__(self, state: str | None = None, fail: bool = False) -> None:
        self.state, self.fail, self.asked = state, fail, []

    def accounting_rows(self, job_ids):  # type: ignore[no-untyped-def]
        from ddlaunch.slurm.parse import QueueRow

        self.asked.append(list(job_ids))
        if self.fail:
            raise OSError("sacct: slurmdbd unreachable")
        return {"7_1": QueueRow("7_1", self.state, "", "")} if self.state else {}


def test_cancel_reason_from_the_run_dir_then_accounting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ddlaunch.attempts import CANCEL_FILE, cancel_reason

    running = _Accounting("RUNNING")
    assert cancel_reason(tmp_path, "7_1", running) is None and running.asked == [["7_1"]]
    assert cancel_reason(tmp_path, "7_1", _Accounting("CANCELLED")) == "cancelled (scancel)"
    assert cancel_reason(tmp_path, "7_1", _Accounting(fail=True)) is None
    assert cancel_reason(tmp_path, "7_1", _Accounting()) is None  # accounting disabled
    (tmp_path / CANCEL_FILE).write_text("{}")
    untouched = _Accounting("RUNNING")
    assert cancel_reason(tmp_path, "7_1", untouched) == "cancelled with ddlaunch cancel"
    assert untouched.asked == []  # the run directory answers first
