"""``health/heartbeat/rank-<R>.json``: each rank's latest heartbeat (step, time, step and busy
time, where it is stuck), overwritten by rename every ``health.heartbeat_interval`` and never
fsynced (a lost heartbeat is harmless, an fsync storm from thousands of ranks is not). Written
by the ranks (``ddlaunch.worker.heartbeat``), read by the watchdog."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = ("health", "heartbeat")


def heartbeat_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir).joinpath(*HEARTBEAT_DIR)


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return heartbeat_dir(run_dir) / f"rank-{rank}.json"


def write_heartbeat(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # No fsync on purpose (see the module doc); rename keeps readers from torn files.
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_heartbeats(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's latest heartbeat record (unreadable or half-written files are skipped)."""
    records = []
    directory = heartbeat_dir(run_dir)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        try:
            with open(directory / name, encoding="utf-8") as handle:
                records.append(json.load(handle))
        except (OSError, ValueError):
            continue
    return records
