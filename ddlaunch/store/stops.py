"""``stop.json``: ddlaunch asked the trainer of this attempt to stop (the pre-timeout signal
forwarded by the batch shell, or ``trainer.stop_before_limit``). Written by the stop hook
before it signals the ranks, completed when it saw the save; read by the end hook (so the
attempt is requeued whatever the trainer's exit code) and by the next start hook when the
batch shell never reached the end hook (a trainer that ran ``scontrol requeue`` itself)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId, AttemptRecord

STOP_FILE = "stop.json"
# What readers rely on; ``Stop`` has an attribute for each.
FIELDS = {
    "job_id": records.TEXT,
    "restart_count": records.INT,
    "relaunch": records.INT,
    "time": records.NUMBER,
    "why": records.TEXT,  # what the stop is for (the time limit, stop_before_limit)
    "signal": records.TEXT,  # the trainer's save signal, NONE: TERM at once
    "committed_before": records.INT,
    "saved_step": records.INT,  # the step the trainer saved after the signal, once seen
    "waited_s": records.NUMBER,
}


@dataclass(frozen=True, kw_only=True)
class Stop(records.Record):
    """``stop.json`` (see the module's doc)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = STOP_FILE

    job_id: str | None = None
    restart_count: int | None = None
    relaunch: int | None = None
    time: float | None = None
    why: str | None = None
    signal: str | None = None
    committed_before: int | None = None
    saved_step: int | None = None
    waited_s: float | None = None


def write_stop(run_dir: Path, attempt: AttemptId, **fields: object) -> Stop:
    """A new stop request of ``attempt`` (``fields``: JSON values by key)."""
    ids = {"job_id": attempt.job_id, "restart_count": attempt.restart, "time": time.time()}
    return save_stop(run_dir, Stop.from_json({**ids, **fields}))


def save_stop(run_dir: Path, record: Stop) -> Stop:
    fsutil.atomic_write_json(run_dir / STOP_FILE, record.to_json(), 0o600)
    return record


def read_stop(run_dir: Path, attempt: AttemptId) -> Stop | None:
    """This attempt's stop request, or None (an older attempt's does not count)."""
    found, _ = records.load_json(run_dir / STOP_FILE, dict)
    if found is None:
        return None
    record = Stop.from_json(found)
    mine = (record.job_id, record.restart_count or 0, record.relaunch or 0)
    return record if mine == (attempt.job_id, attempt.restart, attempt.relaunch) else None


def read_stop_of(run_dir: Path, record: AttemptRecord) -> Stop | None:
    """The stop request of the attempt ``record`` (an attempts.json entry), or None."""
    job = record.job_id or ""
    return read_stop(run_dir, AttemptId(job, record.restart_count or 0, job))
