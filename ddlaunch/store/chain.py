"""The records of chained runs (``submit --after``): ``after.json`` in the dependent's run
directory (what it was submitted after, and the job id each edge named), ``dependents.json``
in the predecessor's (who waits for it, so that ``resume`` can move them onto its new job).

Both are rewritten whole (temp name, fsync, rename: ``fsutil``), read-modify-write under a
lock of their own (``store.lock.waiting``): two ``submit --after`` of one run at once, or a
resume moving a dependent while another one is added, each keep the other's entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import lock, records
from ddlaunch.store.records import OBJECTS, TEXT

AFTER_FILE = "after.json"
DEPENDENTS_FILE = "dependents.json"
# The lock around each record's read-modify-write (not the resume lock, .ddlaunch.lock:
# a resume holds that one throughout, and a submit --after waits only for this update).
AFTER_LOCK = ".after.lock"
DEPENDENTS_LOCK = ".dependents.lock"

PREDECESSOR_FIELDS: records.Fields = {
    "run_id": TEXT,
    "run_dir": TEXT,
    "name": TEXT,  # the predecessor's job.name
    "env": TEXT,  # DDLAUNCH_AFTER_<NAME>_DIR, set to run_dir for the ranks
    "condition": TEXT,  # ok, any, started
    "job_id": TEXT,  # the job the edge names; null: no edge (it had ended already)
}
DEPENDENT_FIELDS: records.Fields = {"run_id": TEXT, "run_dir": TEXT, "condition": TEXT}
AFTER_FIELDS: records.Fields = {"predecessors": OBJECTS}
DEPENDENTS_FIELDS: records.Fields = {"dependents": OBJECTS}


@dataclass(frozen=True, kw_only=True)
class PredecessorRecord(records.Record):
    """One entry of ``after.json``."""

    FIELDS: ClassVar[records.Fields] = PREDECESSOR_FIELDS
    NAME: ClassVar[str] = AFTER_FILE

    run_id: str | None = None
    run_dir: str | None = None
    name: str | None = None
    env: str | None = None
    condition: str | None = None
    job_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class DependentRecord(records.Record):
    """One entry of ``dependents.json``."""

    FIELDS: ClassVar[records.Fields] = DEPENDENT_FIELDS
    NAME: ClassVar[str] = DEPENDENTS_FILE

    run_id: str | None = None
    run_dir: str | None = None
    condition: str | None = None


def _items(path: Path, key: str, fields: records.Fields) -> list[dict[str, object]]:
    found, _ = records.load_json(path, dict, {})
    items = found.get(key)
    if not isinstance(items, list):
        return []
    out, _ = records.clean_items(items, fields, path.name, key[:-1])
    return out


def read_after(run_dir: Path) -> list[PredecessorRecord]:
    """The predecessors of ``run_dir``; [] when it was submitted after none (or the record
    cannot be used)."""
    items = _items(run_dir / AFTER_FILE, "predecessors", PREDECESSOR_FIELDS)
    return [PredecessorRecord.from_json(i) for i in items]


def write_after(run_dir: Path, predecessors: Sequence[PredecessorRecord]) -> None:
    body = {"predecessors": [p.to_json() for p in predecessors]}
    fsutil.atomic_write_json(run_dir / AFTER_FILE, body, 0o600)


def read_dependents(run_dir: Path) -> list[DependentRecord]:
    items = _items(run_dir / DEPENDENTS_FILE, "dependents", DEPENDENT_FIELDS)
    return [DependentRecord.from_json(i) for i in items]


@contextmanager
def dependents_locked(run_dir: Path) -> Iterator[None]:
    """``run_dir``'s dependents held still for the block: a submit --after holds it from
    reading the predecessor's job id to recording itself, a resume from recording its new
    job id to moving the dependents, so that neither misses the other."""
    with lock.waiting(run_dir / DEPENDENTS_LOCK):
        yield


def add_dependent(run_dir: Path, dependent: DependentRecord) -> None:
    """Add (or replace, by run directory) one dependent of ``run_dir``; the caller holds
    ``dependents_locked``."""
    kept = [d for d in read_dependents(run_dir) if d.run_dir != dependent.run_dir]
    body = {"dependents": [d.to_json() for d in (*kept, dependent)]}
    fsutil.atomic_write_json(run_dir / DEPENDENTS_FILE, body, 0o600)


def update_after(
    run_dir: Path, change: Callable[[PredecessorRecord], PredecessorRecord]
) -> list[PredecessorRecord]:
    """Rewrite each predecessor entry of ``run_dir`` through ``change``, under the record's
    lock (two predecessors resumed at once each move their own entry)."""
    with lock.waiting(run_dir / AFTER_LOCK):
        updated = [change(p) for p in read_after(run_dir)]
        write_after(run_dir, updated)
    return updated
