"""Concluding an attempt: the attempt's identity, and the cancel check a requeue asks first
(the run directory, then accounting)."""

from __future__ import annotations

from pathlib import Path

from ddlaunch.conclude import cancel_reason
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.outcome import CANCEL_FILE


def test_array_tasks_requeue_only_themselves() -> None:
    # The task that carries the array's own id (SLURM_JOB_ID == SLURM_ARRAY_JOB_ID) must
    # still name itself, or `scontrol requeue` would requeue every task of the array.
    env = {"SLURM_JOB_ID": "480", "SLURM_ARRAY_JOB_ID": "480", "SLURM_ARRAY_TASK_ID": "7"}
    assert AttemptId.from_env(env) == AttemptId("480", 0, "480_7")
    assert AttemptId.from_env({"SLURM_JOB_ID": "481", "SLURM_RESTART_COUNT": "2"}).task == "481"
    assert AttemptId.from_env({}).key == "local-0"


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
    running = _Accounting("RUNNING")
    assert cancel_reason(tmp_path, "7_1", running) is None and running.asked == [["7_1"]]
    assert cancel_reason(tmp_path, "7_1", _Accounting("CANCELLED")) == "cancelled (scancel)"
    assert cancel_reason(tmp_path, "7_1", _Accounting(fail=True)) is None
    assert cancel_reason(tmp_path, "7_1", _Accounting()) is None  # accounting disabled
    (tmp_path / CANCEL_FILE).write_text("{}")
    untouched = _Accounting("RUNNING")
    assert cancel_reason(tmp_path, "7_1", untouched) == "cancelled"
    assert untouched.asked == []  # the run directory answers first


# sinfo -N of a three-node partition with 4 GPUs a node (the dev cluster's lane).
LANE0 = "".join(f"node{i}|lane0|gpu:4|8|infinite|1-infinite\n" for i in (2, 3, 4))


def _failed_on_node4(tmp_path: Path, *sets: str) -> Path:
    from support.rundirs import example_run_dir, write_attempts

    from ddlaunch.store import exclusions

    run_dir = example_run_dir(tmp_path, "job.partition=lane0", *sets)
    write_attempts(run_dir, [{"attempt": 0, "job_id": "9", "nodes": "node[2-4]", "start": 1.0}])
    exclusions.add_excluded(run_dir, ["node4"], "node failure: node4 down")
    return run_dir


def test_a_requeue_without_the_failed_node_that_could_never_start_stops_the_run(
    tmp_path: Path,
) -> None:
    """2 nodes and a spare on a 3-node partition lose node4: requeued without it, the job
    would pend for good (BadConstraints). The run stops with the numbers instead, recorded
    as the attempt's decision and the outcome; one sinfo call, no requeue."""
    from support.fakes import FakeRunner
    from support.rundirs import attempt_json

    from ddlaunch.conclude import conclude
    from ddlaunch.policy import requeue as policy
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.store import outcome

    run_dir = _failed_on_node4(tmp_path, "nodes.count=2", "fault_tolerance.spare_nodes=1")
    runner = FakeRunner({"sinfo -h -a -N": LANE0})
    ending = policy.Ending(policy.CAUSE_NODE_FAILURE, 60, blamed=("node4",))
    said: list[str] = []
    done = conclude(
        run_dir, ending, policy.RetryBudget(3), SlurmClient(runner), job="9", say=said.append
    )
    why = (
        "stopped: the requeue without node4 needs 3 nodes (nodes.count 2 + "
        "fault_tolerance.spare_nodes 1); partition lane0 has 2 usable (3 nodes with 2 GPUs "
        "or more, 1 excluded), so it could never start"
    )
    assert (done.state, done.decision.reason, said) == ("FAILED", why, [f"FAILED: {why}"])
    # What the job excludes already is asked (none known here); no update, no requeue.
    assert runner.count("sinfo") == 1
    shown = [c for c in runner.calls if c[0] == "scontrol"]
    assert shown == [["scontrol", "show", "job", "-o", "9"]]
    (record,) = attempt_json(run_dir)
    assert (record["cause"], record["decision"], record["blamed"]) == (
        "node failure",
        why,
        ["node4"],
    )
    recorded = outcome.read_outcome(run_dir)
    assert recorded is not None and (recorded.state, recorded.reason) == ("FAILED", why)


def test_a_requeue_that_can_start_without_the_failed_node_goes_ahead(tmp_path: Path) -> None:
    from support.fakes import FakeRunner

    from ddlaunch.conclude import conclude
    from ddlaunch.policy import requeue as policy
    from ddlaunch.slurm.client import SlurmClient

    run_dir = _failed_on_node4(tmp_path, "nodes.count=2")
    runner = FakeRunner({"sinfo -h -a -N": LANE0, "scontrol show job": "JobId=9 Restarts=0\n"})
    ending = policy.Ending(policy.CAUSE_NODE_FAILURE, 60, blamed=("node4",))
    done = conclude(
        run_dir, ending, policy.RetryBudget(3), SlurmClient(runner), job="9", say=lambda s: None
    )
    assert done.requeued and runner.count("sinfo") == 1
    assert [c for c in runner.calls if c[0] == "scontrol"] == [
        ["scontrol", "show", "job", "-o", "9"],
        ["scontrol", "update", "JobId=9", "ExcNodeList=node4"],
        ["scontrol", "requeue", "9"],
    ]


# `scontrol show job -o` of a job submitted with my bad-node list's node2 and node3 excluded:
# the recorded 22.05 line of a running job (tests/support/sweeps.py, job 376) with its
# ExcNodeList as sbatch --exclude=node2,node3 sets it.
def _show_job(exc_node_list: str) -> str:
    from support.sweeps import SHOW_JOB_ARRAY_374

    line = SHOW_JOB_ARRAY_374.splitlines()[1]
    assert "ExcNodeList=(null)" in line
    return line.replace("ExcNodeList=(null)", f"ExcNodeList={exc_node_list}") + "\n"


def test_a_requeue_keeps_the_nodes_the_job_was_submitted_without(tmp_path: Path) -> None:
    """Slurm's ExcNodeList update replaces the list: a requeue that leaves the failed node
    out must set again what the job excluded at its submission (the bad-node list's nodes
    then), or its next start may land on them."""
    from support.fakes import FakeRunner

    from ddlaunch.conclude import conclude
    from ddlaunch.policy import requeue as policy
    from ddlaunch.slurm.client import SlurmClient

    run_dir = _failed_on_node4(tmp_path, "nodes.count=1")
    lane = "".join(f"node{i}|lane0|gpu:4|8|infinite|1-infinite\n" for i in range(1, 6))
    runner = FakeRunner({"sinfo -h -a -N": lane, "scontrol show job": _show_job("node[2-3]")})
    ending = policy.Ending(policy.CAUSE_NODE_FAILURE, 60, blamed=("node4",))
    done = conclude(
        run_dir, ending, policy.RetryBudget(3), SlurmClient(runner), job="9", say=lambda s: None
    )
    assert done.requeued
    assert [c for c in runner.calls if c[0] == "scontrol"] == [
        ["scontrol", "show", "job", "-o", "9"],
        ["scontrol", "update", "JobId=9", "ExcNodeList=node2,node3,node4"],
        ["scontrol", "requeue", "9"],
    ]


def test_a_requeue_counts_the_nodes_the_job_excludes_already(tmp_path: Path) -> None:
    """Two nodes on a three-node partition, node3 excluded since the submission: without
    node4 too, one node is left, so the requeue would pend for good and the run stops,
    naming both."""
    from support.fakes import FakeRunner

    from ddlaunch.conclude import conclude
    from ddlaunch.policy import requeue as policy
    from ddlaunch.slurm.client import SlurmClient

    run_dir = _failed_on_node4(tmp_path, "nodes.count=2")
    runner = FakeRunner({"sinfo -h -a -N": LANE0, "scontrol show job": _show_job("node3")})
    ending = policy.Ending(policy.CAUSE_NODE_FAILURE, 60, blamed=("node4",))
    done = conclude(
        run_dir, ending, policy.RetryBudget(3), SlurmClient(runner), job="9", say=lambda s: None
    )
    assert done.state == "FAILED"
    assert done.decision.reason == (
        "stopped: the requeue without node4 needs 2 nodes (nodes.count); partition lane0 "
        "has 1 usable (3 nodes with 2 GPUs or more, 2 excluded), so it could never start"
    )
    assert runner.count("scontrol") == 1  # the show job; no update, no requeue
