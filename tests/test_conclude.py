"""Concluding an attempt: the attempt's identity, and the cancel check a requeue asks first
(the run directory, then accounting)."""

from __future__ import annotations

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
