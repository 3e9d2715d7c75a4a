"""A rank's exception (type, message, where, traceback), written by the rank before the
exception ends it; read by ``status``, ``logs``, the end hook (ranks without a record died
silently: their node is a suspect) and the local launcher.

One file per node, ``failures/node-<host>.jsonl``: each failing rank appends its record as one
line (a single ``O_APPEND`` write, so the ranks of a node never interleave). When a collective
fails every rank fails at once: at 2,000 nodes x 8 that is 2,000 creates in the directory, not
16,000, on a parallel filesystem's one metadata server. A rank's newest record (attempt,
restart inside it, time) is its record, as when each rank had its own file; run directories
of earlier versions hold ``failures/rank-<R>.json``, still read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.policy import attribution
from ddlaunch.store import records
from ddlaunch.store.layout import HISTORY_DIR

FAILURES_DIR = "failures"
# What readers of a rank's record rely on (``store.records.clean``).
FIELDS = {
    "rank": records.INT,
    "host": records.TEXT,
    "exception": records.TEXT,
    "message": records.TEXT,
    "where": records.TEXT,
    "job_id": records.TEXT,
    "attempt": records.INT,
    "time": records.NUMBER,
}
# Our own control flow (``worker.stops.StopRank``), never a failure; earlier versions wrote
# records for them, which readers skip.
NOT_FAILURES = frozenset({"Preempted", "PreflightFailed"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def node_failures_path(run_dir: str | Path, host: str) -> Path:
    return Path(run_dir) / FAILURES_DIR / f"node-{_UNSAFE.sub('_', host) or 'unknown'}.jsonl"


def write_failure(run_dir: str | Path, rank: int, record: Mapping[str, object]) -> None:
    """Append ``record`` (``FIELDS``, and ``traceback``, ``relaunch``, a replica group's
    ``group``, ``group_rank``, ``group_restart``) to its node's file. Not durable (no fsync):
    a record lost to a power cut costs only detail, srun's reports still name the rank."""
    line = (json.dumps({**record, "rank": rank}, default=str) + "\n").encode()
    path = node_failures_path(run_dir, str(record.get("host") or os.uname().nodename))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _raw_records(
    run_dir: Path, folder: str = FAILURES_DIR
) -> Iterator[tuple[str, object, records.Problem | None]]:
    """(where, the decoded record, why it could not be read) of every record in the run's
    ``folder``: each line of the node files, then each earlier-version rank file."""
    directory = run_dir / folder
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        where = f"{folder}/{name}"
        node_file = name.startswith("node-") and name.endswith(".jsonl")
        if not node_file and not (name.startswith("rank-") and name.endswith(".json")):
            continue
        text = records.read_text(directory / name, where)
        if text is None:
            continue
        if isinstance(text, records.Problem):
            yield where, None, text
            continue
        if not node_file:
            yield _decoded(where, text)
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():  # a torn last line (a rank killed mid-write) is a problem too
                yield _decoded(f"{where} line {number}", line)


def _decoded(where: str, text: str) -> tuple[str, object, records.Problem | None]:
    value = records.parse_json(text, where)
    if isinstance(value, records.Problem):
        return where, None, value
    return where, value, None


def _newest(record: Mapping[str, object]) -> tuple[float, float, float]:
    return (
        _number(record.get("attempt")),
        _number(record.get("relaunch")),
        _number(record.get("time")),
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def rank_records(run_dir: str | Path) -> dict[int, tuple[str, dict[str, object]]]:
    """Each rank's newest record as written (where it is, the record), by rank; records that
    are not objects with an integer rank are left out (``unusable_failures`` names them)."""
    newest: dict[int, tuple[str, dict[str, object]]] = {}
    for where, rec, _ in _raw_records(Path(run_dir)):
        if not isinstance(rec, dict):
            continue
        rank = rec.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            continue
        kept = newest.get(rank)
        if kept is None or _newest(rec) >= _newest(kept[1]):
            newest[rank] = (where, rec)
    return newest


def read_failure(run_dir: str | Path, rank: int) -> Failure | None:
    """The rank's newest failure record; None without one (or with an unusable one)."""
    found = rank_records(run_dir).get(rank)
    return None if found is None else _failure(*found)


@dataclass
class Failure:
    rank: int
    host: str
    exception: str
    message: str
    where: str | None
    job_id: str | None = None
    attempt: int | None = None
    traceback: str = ""
    time: float = 0.0
    relaunch: int = 0  # the restart inside the allocation it failed in

    def one_line(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"rank {self.rank} on {self.host}: {self.exception}: {self.message}{loc}"


def read_failures(run_dir: Path) -> list[Failure]:
    """Every rank's failure record, the cause first: the newest attempt, then real errors
    before collateral ones (a peer's "connection closed" / timeout in a collective), then
    the earliest."""
    found = (_failure(where, rec) for where, rec in rank_records(run_dir).values())
    failures = [f for f in found if f is not None and f.exception not in NOT_FAILURES]
    failures.sort(key=lambda f: (-(f.attempt or 0), -f.relaunch, is_collateral(f), f.time, f.rank))
    return failures


def every_failure(run_dir: Path) -> list[Failure]:
    """Every failure record of the run, oldest first: each rank's in every attempt (not only
    its newest, as ``read_failures`` keeps), and those a ``resume`` moved into
    ``history/<stamp>-failures``; ``report`` draws each."""
    archived = sorted(p.name for p in (run_dir / HISTORY_DIR).glob(f"*-{FAILURES_DIR}"))
    found = []
    for folder in (*(f"{HISTORY_DIR}/{name}" for name in archived), FAILURES_DIR):
        for where, rec, _ in _raw_records(run_dir, folder):
            failure = _failure(where, rec) if isinstance(rec, dict) else None
            if failure is not None and failure.exception not in NOT_FAILURES:
                found.append(failure)
    return sorted(found, key=lambda f: (f.time, f.rank))


def _failure(where: str, rec: Mapping[str, object]) -> Failure | None:
    """The record as a ``Failure``; None when a field has the wrong kind (not evidence:
    ``app.runs`` says so in the run's row)."""
    found = dict(rec)
    if records.clean(found, FIELDS, where):
        return None
    rec = found
    rank = records.whole(rec.get("rank"))
    return Failure(
        rank=-1 if rank is None else rank,
        host=str(rec.get("host", "?")),
        exception=str(rec.get("exception", "?")),
        message=str(rec.get("message", "")),
        where=records.text(rec.get("where")),
        job_id=records.text(rec.get("job_id")),
        attempt=records.whole(rec.get("attempt")),
        traceback=str(rec.get("traceback", "")),
        time=records.number(rec.get("time")) or 0.0,
        relaunch=int(_number(rec.get("relaunch"))),
    )


def is_collateral(failure: Failure) -> bool:
    """A peer's error (a connection closed or reset, a collective timed out): the rank
    failed because another one did (``policy.attribution`` holds the words)."""
    return attribution.is_collateral(failure.message, failure.exception)


def unusable_failures(run_dir: Path) -> list[records.Problem]:
    """The records ``read_failures`` skips because they cannot be used, and why."""
    problems = []
    for where, rec, problem in _raw_records(run_dir):
        if problem is not None:
            problems.append(problem)
        elif not isinstance(rec, dict):
            found = records.kind_name(rec)
            problems.append(records.Problem(where, f"{found} where an object is expected"))
        else:
            problems += records.clean(dict(rec), FIELDS, where)
    return problems
