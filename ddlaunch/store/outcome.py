"""``outcome.json``: how a run ended (its final state and why), written by whoever concludes
its last attempt; ``cancel.json``: written by ``ddlaunch cancel`` before it calls scancel, so
that the job's own requeue logic knows the stop was wanted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import NUMBER, TEXT

OUTCOME_FILE = "outcome.json"
CANCEL_FILE = "cancel.json"
FIELDS = {"state": TEXT, "reason": TEXT, "time": NUMBER}  # what readers rely on


def write_outcome(run_dir: Path, state: str, reason: str = "", **extra: Any) -> None:
    record: dict[str, Any] = {"state": state, "time": time.time(), **extra}
    if reason:
        record["reason"] = reason
    fsutil.atomic_write_json(run_dir / OUTCOME_FILE, record, 0o600)


def read_outcome(run_dir: Path) -> dict[str, Any] | None:
    """How the run ended; None when nobody recorded it or the record cannot be used."""
    found, _ = records.load_json(run_dir / OUTCOME_FILE, dict)
    if found is not None:
        records.clean(found, FIELDS, OUTCOME_FILE)
    return found


def write_cancel(run_dir: Path, job_ids: list[str]) -> None:
    fsutil.atomic_write_json(
        run_dir / CANCEL_FILE, {"time": time.time(), "job_ids": job_ids}, 0o600
    )


def cancel_requested(run_dir: Path) -> bool:
    return (run_dir / CANCEL_FILE).exists()
