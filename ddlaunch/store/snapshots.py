"""Which code snapshot a run uses: ``<run dir>/snapshot.json`` (kind, id, path, source, the
ranks' working directory). The snapshots themselves live in ``<run root>/.snapshots/<id>``
(``ddlaunch.app.snapshot`` makes them; the leading dot keeps them out of run listings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch import fsutil

SNAPSHOTS_DIR = ".snapshots"
SNAPSHOT_FILE = "snapshot.json"


def write_snapshot(run_dir: Path, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(run_dir / SNAPSHOT_FILE, record, 0o600)


def read_snapshot(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = fsutil.read_json(run_dir / SNAPSHOT_FILE)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
