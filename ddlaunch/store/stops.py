"""``stop.json``: ddlaunch asked the trainer of this attempt to stop (the pre-timeout signal
forwarded by the batch shell, or ``trainer.stop_before_limit``). Written by the stop hook
before it signals the ranks, completed when it saw the save; read by the end hook (so the
attempt is requeued whatever the trainer's exit code) and by the next start hook when the
batch shell never reached the end hook (a trainer that ran ``scontrol requeue`` itself)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.attempts import AttemptId, AttemptRecord

STOP_FILE = "stop.json"


def write_stop(run_dir: Path, attempt: AttemptId, **fields: Any) -> dict[str, Any]:
    record = {"job_id": attempt.job_id, "restart_count": attempt.restart, "time": time.time()}
    record.update(fields)
    fsutil.atomic_write_json(run_dir / STOP_FILE, record, 0o600)
    return record


def read_stop(run_dir: Path, attempt: AttemptId) -> dict[str, Any] | None:
    """This attempt's stop request, or None (an older attempt's does not count)."""
    try:
        record = fsutil.read_json(run_dir / STOP_FILE)
    except ValueError:
        return None
    if not isinstance(record, dict) or not attempt.matches(record):
        return None
    return record


def read_stop_of(run_dir: Path, record: AttemptRecord) -> dict[str, Any] | None:
    """The stop request of the attempt ``record`` (an attempts.json entry), or None."""
    job = record.job_id or ""
    return read_stop(run_dir, AttemptId(job, record.restart_count or 0, job))
