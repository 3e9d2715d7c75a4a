"""Run status: the run directory joined with one batched Slurm query (pure joining logic)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ddlaunch.runs import RunInfo
from ddlaunch.slurm.parse import QueueRow

# Slurm's many job states folded into the few a user acts on.
STATE_MAP = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "SIGNALING": "RUNNING",
    "SUSPENDED": "SUSPENDED",
    "STOPPED": "SUSPENDED",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED",
    "OUT_OF_MEMORY": "FAILED",
    "BOOT_FAIL": "FAILED",
    "DEADLINE": "FAILED",
    "NODE_FAIL": "NODE_FAIL",
    "PREEMPTED": "PREEMPTED",
    "TIMEOUT": "TIMEOUT",
    "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED",
}


def fold_state(slurm_state: str) -> str:
    # sacct prints "CANCELLED by 0"; JSON of newer releases gives lists joined elsewhere.
    head = slurm_state.split()[0].upper() if slurm_state.strip() else ""
    return STATE_MAP.get(head, head or "UNKNOWN")


@dataclass
class RunStatus:
    run_id: str
    path: str
    job_id: str | None
    state: str
    nodes: str
    reason: str
    step: int | None
    checkpoint_step: int | None
    attempts: int
    failure: str | None
    detail: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_status(info: RunInfo, queued: QueueRow | None, shown: dict[str, str] | None) -> RunStatus:
    """Combine what Slurm says (queue row, or scontrol for a job that left the queue) with
    what the run directory says."""
    nodes, reason = "", ""
    if queued is not None:
        state, nodes, reason = fold_state(queued.state), queued.nodes, queued.reason
    elif shown is not None:
        state = fold_state(shown.get("JobState", ""))
        nodes, reason = shown.get("NodeList", ""), shown.get("Reason", "")
    elif info.outcome:
        state = str(info.outcome.get("state", "UNKNOWN"))
    elif info.result is not None:
        state = "COMPLETED"
    elif info.failures:
        state = "FAILED"
    elif info.intent.get("state") == "failed":
        state = "SUBMIT_FAILED"
    else:
        state = "UNKNOWN"
    # A local run (or an outcome recorded by the job) is more precise than Slurm's view.
    if info.outcome and state in ("COMPLETED", "FAILED", "UNKNOWN", "CANCELLED"):
        state = str(info.outcome.get("state", state))
    failure = info.failures[0].one_line() if info.failures else None
    if state == "SUBMIT_FAILED":
        failure = str(info.intent.get("error", ""))
    detail = (
        str(info.outcome.get("reason")) if info.outcome and info.outcome.get("reason") else None
    )
    step = None
    if info.progress:
        step = info.progress.get("step")
    return RunStatus(
        run_id=info.run_id,
        path=str(info.path),
        job_id=info.job_id,
        state=state,
        nodes=nodes,
        reason=reason if reason not in ("None", "(null)") else "",
        step=step,
        checkpoint_step=info.latest_step,
        attempts=max(len(info.attempts), 1 if info.job_ids else 0),
        failure=failure,
        detail=detail,
    )
