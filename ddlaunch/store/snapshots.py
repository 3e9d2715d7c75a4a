"""Which code snapshot a run uses: ``<run dir>/snapshot.json`` (kind, id, path, source, the
ranks' working directory). The snapshots themselves live in ``<run root>/.snapshots/<id>``
(``ddlaunch.app.snapshot`` makes them; the leading dot keeps them out of run listings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.layout import SNAPSHOTS_DIR as SNAPSHOTS_DIR

SNAPSHOT_FILE = "snapshot.json"
# What readers of the record rely on (``store.records.clean``).
FIELDS = {
    "kind": records.TEXT,
    "id": records.TEXT,
    "path": records.TEXT,
    "source": records.TEXT,
    "workdir": records.TEXT,
    "created": records.BOOL,
    "files": records.INT,
    "seconds": records.NUMBER,
}


@dataclass(frozen=True, kw_only=True)
class SnapshotRecord(records.Record):
    """``snapshot.json``: the snapshot's kind (git, copy) and id, where it is, what was
    snapshotted, the ranks' working directory inside it; whether this run made it, of how
    many files, in how many seconds."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = SNAPSHOT_FILE

    kind: str | None = None
    id: str | None = None
    path: str | None = None
    source: str | None = None
    workdir: str | None = None
    created: bool | None = None
    files: int | None = None
    seconds: float | None = None


def write_snapshot(run_dir: Path, record: SnapshotRecord) -> None:
    fsutil.atomic_write_json(run_dir / SNAPSHOT_FILE, record.to_json(), 0o600)


def read_snapshot(run_dir: Path) -> SnapshotRecord | None:
    """The record (a field of the wrong kind dropped); None when absent or unusable."""
    record, _ = records.load_json(run_dir / SNAPSHOT_FILE, dict)
    return None if record is None else SnapshotRecord.from_json(record)
