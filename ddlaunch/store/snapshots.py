"""Which code snapshot a run uses: ``<run dir>/snapshot.json`` (kind, id, path, source, the
ranks' working directory). The snapshots themselves live in ``<run root>/.snapshots/<id>``
(``ddlaunch.app.snapshot`` makes them; the leading dot keeps them out of run listings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store import records

SNAPSHOTS_DIR = ".snapshots"
SNAPSHOT_FILE = "snapshot.json"
# What readers of the record rely on (``store.records.clean``).
FIELDS = {
    "kind": records.TEXT,
    "id": records.TEXT,
    "path": records.TEXT,
    "source": records.TEXT,
    "workdir": records.TEXT,
}


def write_snapshot(run_dir: Path, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(run_dir / SNAPSHOT_FILE, record, 0o600)


def read_snapshot(run_dir: Path) -> dict[str, Any] | None:
    """The record, its fields of their kinds; None when absent or unusable."""
    record, _ = records.load_json(run_dir / SNAPSHOT_FILE, dict)
    if record is not None:
        records.clean(record, FIELDS, SNAPSHOT_FILE)
    return record
