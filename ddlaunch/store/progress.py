"""``progress.json``: the step rank 0 reached, a few times a minute (``ddlaunch.train``);
``result.json``: what the training code returned, written by the example trainers."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.records import INT, NUMBER

PROGRESS_FILE = "progress.json"
RESULT_FILE = "result.json"
FIELDS = {"step": INT, "time": NUMBER}  # what readers of progress.json rely on


def write_progress(run_dir: Path, step: int, job_id: str | None) -> None:
    fsutil.atomic_write_json(
        run_dir / PROGRESS_FILE,
        {"step": step, "time": time.time(), "host": socket.gethostname(), "job_id": job_id},
    )


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    fsutil.atomic_write_json(run_dir / RESULT_FILE, result)


def read_result(run_dir: Path) -> dict[str, Any] | None:
    return fsutil.read_json(run_dir / RESULT_FILE)
