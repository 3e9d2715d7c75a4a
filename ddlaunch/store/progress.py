"""``progress.json``: the step rank 0 reached, a few times a minute (``ddlaunch.train``);
``result.json``: what the training code returned, written by the example trainers."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import INT, NUMBER, TEXT

PROGRESS_FILE = "progress.json"
RESULT_FILE = "result.json"
# What readers of progress.json rely on; ``Progress`` has an attribute for each.
FIELDS = {"step": INT, "time": NUMBER, "host": TEXT, "job_id": TEXT}


@dataclass(frozen=True, kw_only=True)
class Progress(records.Record):
    """``progress.json``: rank 0 reached ``step`` at ``time``, on ``host``, in job
    ``job_id`` (None outside Slurm)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = PROGRESS_FILE

    step: int | None = None
    time: float | None = None
    host: str | None = None
    job_id: str | None = None


def write_progress(run_dir: Path, step: int, job_id: str | None) -> None:
    # from_json: a job id None (outside Slurm) is recorded as null, "not known"
    found = {"step": step, "time": time.time(), "host": socket.gethostname(), "job_id": job_id}
    fsutil.atomic_write_json(run_dir / PROGRESS_FILE, Progress.from_json(found).to_json())


def write_result(run_dir: Path, result: Mapping[str, object]) -> None:
    """``result``: the training code's own values (any JSON object)."""
    fsutil.atomic_write_json(run_dir / RESULT_FILE, result)


def read_result(run_dir: Path) -> dict[str, object] | None:
    """The training code's values; None while there are none (``read_run`` too takes only
    an object for a result)."""
    found = fsutil.read_json(run_dir / RESULT_FILE)
    return found if isinstance(found, dict) else None
