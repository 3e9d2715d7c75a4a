"""Data staging records under ``staging/`` (written by each node's leader rank, read by the
watchdog, ``status`` and ``report``):

* ``staging/<job>-<restart>/<host>.json``: one node's staging in one attempt: ``state``
  (``running``, ``done`` or ``failed``), ``start`` / ``end`` times, ``progress`` while it
  copies (bytes done of bytes to copy, rewritten every few seconds) and one entry per data set
  (name, source, the node's copy, what was copied and how long it took);
* ``staging/<job>-<restart>/sbcast/``: the votes and outcome of a broadcast (mode sbcast);
* ``staging/<job>-<restart>.done.json``: every node of the attempt has staged.

The staged copies themselves carry their own manifest (``store.stage_manifest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId

STAGING_DIR = "staging"
RUNNING, DONE, FAILED = "running", "done", "failed"
FINAL = (DONE, FAILED)
# What readers of a node's record rely on (``store.records.clean``); ``NodeStaging`` has an
# attribute for each.
FIELDS = {
    "host": records.TEXT,
    "state": records.TEXT,
    "start": records.NUMBER,
    "time": records.NUMBER,  # when the record was last rewritten (every few seconds)
    "end": records.NUMBER,
    "items": records.OBJECTS,
    "progress": records.OBJECT,
}
# A broadcast's outcome (``sbcast/NAME.json``): sent or not, the votes, the error.
SENT_FIELDS = {"sent": records.BOOL, "votes": records.OBJECT, "error": records.TEXT}


@dataclass(frozen=True, kw_only=True)
class NodeStaging(records.Record):
    """One node's staging in one attempt (see the module's doc)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = "staging"

    host: str | None = None
    state: str | None = None
    start: float | None = None
    time: float | None = None
    end: float | None = None
    items: tuple[Mapping[str, Any], ...] | None = None
    progress: Mapping[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL


@dataclass(frozen=True, kw_only=True)
class Sent(records.Record):
    """A broadcast's outcome (mode sbcast): whether the first node's leader sent the file,
    each node's vote (stale or not), why sbcast failed."""

    FIELDS: ClassVar[records.Fields] = SENT_FIELDS
    NAME: ClassVar[str] = "sbcast"

    sent: bool | None = None
    votes: Mapping[str, Any] | None = None
    error: str | None = None


def attempt_dir(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / STAGING_DIR / attempt.key


def write_node(run_dir: Path, attempt: AttemptId, host: str, record: NodeStaging) -> None:
    fsutil.atomic_write_json(attempt_dir(run_dir, attempt) / f"{host}.json", record.to_json())


def read_node(run_dir: Path, attempt: AttemptId, host: str) -> NodeStaging | None:
    """The node's record; None when there is none or it cannot be used (half-written)."""
    found, _ = records.load_json(attempt_dir(run_dir, attempt) / f"{host}.json", dict)
    return None if found is None else NodeStaging.from_json(found)


def _read_objects(
    directory: Path,
    fields: records.Fields,
    problems: list[records.Problem] | None = None,
    prefix: str = "",
) -> dict[str, dict[str, object]]:
    """Host -> JSON object of each record in ``directory``; unreadable records are skipped
    (and, with ``problems``, said there, named ``<prefix><host>.json``)."""
    out: dict[str, dict[str, object]] = {}
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return out
    for path in paths:
        record, problem = records.load_json(path, dict, name=f"{prefix}{path.name}")
        if problem is None and record is not None:
            found = records.clean(record, fields, f"{prefix}{path.name}")
        else:
            found = [problem] if problem is not None else []
        if problems is not None:
            problems += found
        if record is not None:
            out[path.stem] = record
    return out


def read_dir(
    directory: Path, problems: list[records.Problem] | None = None, prefix: str = ""
) -> dict[str, NodeStaging]:
    """Host -> record of one attempt's directory (see ``_read_objects``)."""
    found = _read_objects(directory, FIELDS, problems, prefix)
    return {host: NodeStaging.from_json(record) for host, record in found.items()}


def read_attempt(run_dir: Path, attempt: AttemptId) -> dict[str, NodeStaging]:
    return read_dir(attempt_dir(run_dir, attempt))


def read_all(
    run_dir: Path, problems: list[records.Problem] | None = None
) -> dict[str, dict[str, NodeStaging]]:
    """Attempt key (``<job>-<restart>``) -> host -> record, for every attempt that staged;
    ``problems`` collects the records that could not be used."""
    root = run_dir / STAGING_DIR
    try:
        keys = sorted(p.name for p in root.iterdir() if p.is_dir())
    except OSError:
        return {}
    return {key: read_dir(root / key, problems, f"{STAGING_DIR}/{key}/") for key in keys}


# A broadcast (mode sbcast) of data set NAME in one attempt: each node's leader votes whether
# its copy is stale (``sbcast/NAME/<host>.json``), the first node's leader records whether it
# sent the file (``sbcast/NAME.json``).


def _broadcast_dir(run_dir: Path, attempt: AttemptId) -> Path:
    return attempt_dir(run_dir, attempt) / "sbcast"


def write_vote(run_dir: Path, attempt: AttemptId, name: str, host: str, stale: bool) -> None:
    fsutil.atomic_write_json(
        _broadcast_dir(run_dir, attempt) / name / f"{host}.json", {"stale": stale}
    )


_VOTE_FIELDS = {"stale": records.BOOL}


def read_votes(run_dir: Path, attempt: AttemptId, name: str) -> dict[str, bool]:
    votes = _read_objects(_broadcast_dir(run_dir, attempt) / name, _VOTE_FIELDS)
    return {host: bool(r.get("stale")) for host, r in votes.items()}


def write_sent(run_dir: Path, attempt: AttemptId, name: str, record: Sent) -> None:
    path = _broadcast_dir(run_dir, attempt) / f"{name}.json"
    fsutil.atomic_write_json(path, record.to_json())


def read_sent(run_dir: Path, attempt: AttemptId, name: str) -> Sent | None:
    """The broadcast's outcome; None until the first node's leader wrote it."""
    found, _ = records.load_json(_broadcast_dir(run_dir, attempt) / f"{name}.json", dict)
    return None if found is None else Sent.from_json(found)


# Every node of an attempt has staged: written by the first node's leader once it counted
# the records, waited for by every other rank (one file to look at, not one per node).


def _all_done_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / STAGING_DIR / f"{attempt.key}.done.json"


def write_all_done(run_dir: Path, attempt: AttemptId, record: Mapping[str, object]) -> None:
    fsutil.atomic_write_json(_all_done_path(run_dir, attempt), record)


def all_done(run_dir: Path, attempt: AttemptId) -> bool:
    return _all_done_path(run_dir, attempt).exists()
