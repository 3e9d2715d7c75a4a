"""``<sweep>/cancelled.json``: members that ``ddlaunch cancel`` cancelled before they started,
with the job id (``ARRAY_TASK``) it cancelled. Such a member has no run directory to hold a
``cancel.json`` (and cancelling it must not create one): its state comes from here once
Slurm has forgotten the job, and a member directory created later (the task started after
all, in the instant before scancel) starts with its ``cancel.json``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from ddlaunch import fsutil

CANCELLED_FILE = "cancelled.json"


def cancelled_members(sweep_dir: Path) -> dict[int, str]:
    """Member -> the job id that was cancelled (unreadable: none)."""
    try:
        data = fsutil.read_json(sweep_dir / CANCELLED_FILE, {}) or {}
    except (OSError, ValueError):  # damaged (not UTF-8 included): none known
        return {}
    members = data.get("members", {}) if isinstance(data, dict) else {}
    if not isinstance(members, dict):
        return {}
    return {
        int(k): str(v.get("job_id"))
        for k, v in members.items()
        if isinstance(v, dict) and k.isdigit()
    }


def record_cancelled(sweep_dir: Path, jobs: Mapping[int, str]) -> None:
    """Add ``jobs`` (member -> cancelled job id), before the scancel."""
    try:
        data = fsutil.read_json(sweep_dir / CANCELLED_FILE, {}) or {}
    except (OSError, ValueError):
        data = {}
    members = data.get("members", {}) if isinstance(data, dict) else {}
    members = dict(members) if isinstance(members, dict) else {}
    now = time.time()
    for index, job_id in jobs.items():
        members[str(index)] = {"job_id": job_id, "time": now}
    fsutil.atomic_write_json(sweep_dir / CANCELLED_FILE, {"members": members}, 0o600)


def is_cancelled(sweep_dir: Path, index: int, job_id: str | None) -> bool:
    """Whether member ``index``'s job ``job_id`` (its latest) was cancelled before it started."""
    return job_id is not None and cancelled_members(sweep_dir).get(index) == job_id
