"""``attempts.json``: one record per start of the ranks (the first submission, each requeue,
each restart inside the allocation: ``in_allocation``, ``relaunch``): when it started, on
which nodes, from which committed step it resumed, and how and why it ended. Opened by the
start hook, closed by whoever concludes the attempt (``ddlaunch.conclude``).

``AttemptId`` names an attempt as every record of it does: the Slurm job id and its restart
count, read from the job's environment in one place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.layout import KUBERNETES_JOB_VAR, KUBERNETES_RESTART_VAR
from ddlaunch.store.records import INT, NUMBER, STRINGS, TEXT

ATTEMPTS_FILE = "attempts.json"
# The fields of an attempt record readers rely on, with their kinds (``store.records.clean``).
FIELDS = {
    "attempt": INT,
    "job_id": TEXT,
    "restart_count": INT,
    "nodes": TEXT,
    "batch_host": TEXT,
    "start": NUMBER,
    "end": NUMBER,
    "cause": TEXT,
    "decision": TEXT,
    "resumed_from": INT,
    "committed_step": INT,
    "blamed": STRINGS,
    # The batch log's size when the start hook opened the attempt: where this attempt's part
    # of it begins (a requeued job appends to the same file).
    "log_offset": INT,
}

# The batch script counts its restarts inside the allocation (new srun steps of one job start)
# in this variable; the ranks and the hooks read it to tell those attempts apart.
RELAUNCH_VAR = "DDLAUNCH_RELAUNCH"


@dataclass(frozen=True)
class AttemptId:
    """``job_id``: ``SLURM_JOB_ID`` (empty outside Slurm; the object's name in a Kubernetes
    pod), the name the batch-host records use; ``task``: the job as Slurm addresses it,
    ``ARRAY_TASK`` for an array task (what ``scontrol requeue`` must be given, what the
    ranks' failure records carry); ``restart``: ``SLURM_RESTART_COUNT``; ``relaunch``: the
    restarts inside this start of the job so far (``$DDLAUNCH_RELAUNCH``: Slurm's count does
    not move for those)."""

    job_id: str
    restart: int
    task: str = ""
    relaunch: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AttemptId:
        job_id = env.get("SLURM_JOB_ID", "")
        pod_job = env.get(KUBERNETES_JOB_VAR)
        if pod_job and not job_id:
            # A pod of --target kubernetes: the object's name (stable across restarts, as a
            # Slurm job id across requeues) and the attempt the pod entry worked out.
            return cls(pod_job, int(env.get(KUBERNETES_RESTART_VAR, "0") or 0), pod_job)
        array, index = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        # `scontrol requeue A` (the array's own id, which one task carries as SLURM_JOB_ID)
        # would requeue every task of the array (measured on 22.05.8): name the task.
        task = f"{array}_{index}" if array and index else job_id
        restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        return cls(job_id, restart, task, int(env.get(RELAUNCH_VAR, "0") or 0))

    @property
    def key(self) -> str:
        """The attempt in per-attempt file names: ``<job>-<restart>`` (``local`` outside
        Slurm), ``<job>-<restart>.<relaunch>`` for a restart inside the allocation."""
        return key_of(self.job_id or "local", self.restart, self.relaunch)

    def matches(self, record: Mapping[str, Any]) -> bool:
        """Whether an attempt record (``job_id``, ``restart_count``, ``relaunch``) is this
        attempt."""
        return (
            str(record.get("job_id")) == self.job_id
            and int(record.get("restart_count", 0) or 0) == self.restart
            and int(record.get("relaunch", 0) or 0) == self.relaunch
        )


def key_of(job_id: str, restart: int, relaunch: int = 0) -> str:
    return f"{job_id}-{restart}" + (f".{relaunch}" if relaunch else "")


def record_key(record: Mapping[str, Any]) -> str:
    """``AttemptId.key`` of an attempt record."""
    return key_of(
        str(record.get("job_id", "")),
        int(record.get("restart_count", 0) or 0),
        int(record.get("relaunch", 0) or 0),
    )


def requeues(records: list[dict[str, Any]]) -> int:
    """Requeues so far: the attempts after the first that began a new start of the job."""
    return sum(1 for r in records[1:] if not r.get("in_allocation"))


def restarts(records: list[dict[str, Any]]) -> int:
    """Restarts inside an allocation so far (new srun steps of a running job)."""
    return sum(1 for r in records if r.get("in_allocation"))


def load(run_dir: Path) -> list[dict[str, Any]]:
    """The attempt records; a file that cannot be used counts as none (``app.runs`` tells
    the user which and why), so that concluding an attempt never fails on it."""
    found, _ = records.load_json(run_dir / ATTEMPTS_FILE, list, [])
    return records.clean_items(found, FIELDS, ATTEMPTS_FILE)[0]


def save(run_dir: Path, attempts: list[dict[str, Any]]) -> None:
    fsutil.atomic_write_json(run_dir / ATTEMPTS_FILE, attempts, 0o600)


def is_open(record: Mapping[str, Any]) -> bool:
    return "end" not in record


def close(record: dict[str, Any], *, cause: str, committed_step: int | None, **extra: Any) -> None:
    """Mark ``record`` ended now (in memory; the caller saves)."""
    record.update({"end": time.time(), "cause": cause, "committed_step": committed_step, **extra})


def end_last(run_dir: Path, *, cause: str, committed_step: int | None, **extra: Any) -> bool:
    """Close the newest open attempt; False when there is none (closed already, or none)."""
    attempts = load(run_dir)
    if not attempts or not is_open(attempts[-1]):
        return False
    close(attempts[-1], cause=cause, committed_step=committed_step, **extra)
    save(run_dir, attempts)
    return True


def update_open(run_dir: Path, **fields: Any) -> bool:
    """Add ``fields`` to the newest attempt while it is open (e.g. its preflight verdicts)."""
    attempts = load(run_dir)
    if not attempts or not is_open(attempts[-1]):
        return False
    attempts[-1].update(fields)
    save(run_dir, attempts)
    return True


def update_last(run_dir: Path, **fields: Any) -> bool:
    """Add ``fields`` to the newest attempt, open or closed (what its requeue went through)."""
    attempts = load(run_dir)
    if not attempts:
        return False
    attempts[-1].update(fields)
    save(run_dir, attempts)
    return True


def new_record(
    index: int, attempt: AttemptId, *, nodes: str, host: str, resumed_from: int | None
) -> dict[str, Any]:
    return {
        "attempt": index,
        "job_id": attempt.job_id,
        "restart_count": attempt.restart,
        "nodes": nodes,
        "batch_host": host,
        "start": time.time(),
        "resumed_from": resumed_from,
        **({"in_allocation": True, "relaunch": attempt.relaunch} if attempt.relaunch else {}),
    }
