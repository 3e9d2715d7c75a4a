"""``failures/rank-<R>.json``: a rank's exception (type, message, where, traceback), written by
the rank before the exception ends it; read by ``status``, ``logs``, the end hook (ranks
without a record died silently: their node is a suspect) and the local launcher."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.policy import attribution
from ddlaunch.store import records

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


def failure_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / FAILURES_DIR / f"rank-{rank}.json"


def write_failure(run_dir: str | Path, rank: int, record: dict[str, Any]) -> None:
    # Not durable (no fsync): when a collective fails, every rank writes one at once (16,000
    # at 2,000 nodes x 8, twice the fsyncs on one directory); a record lost to a power cut
    # costs only detail, srun's reports still name the rank.
    fsutil.atomic_write_json(failure_path(run_dir, rank), record, durable=False)


def read_failure_record(run_dir: str | Path, rank: int) -> dict[str, Any] | None:
    try:
        record = fsutil.read_json(failure_path(run_dir, rank))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


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
    failures = []
    for path in sorted((run_dir / FAILURES_DIR).glob("rank-*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(rec, dict) or rec.get("exception") in NOT_FAILURES:
            continue
        if records.clean(rec, FIELDS, f"{FAILURES_DIR}/{path.name}"):
            continue  # wrongly typed: not evidence (``app.runs`` says so in the run's row)
        failures.append(
            Failure(
                rank=int(rec.get("rank", -1)),
                host=str(rec.get("host", "?")),
                exception=str(rec.get("exception", "?")),
                message=str(rec.get("message", "")),
                where=rec.get("where"),
                job_id=rec.get("job_id"),
                attempt=rec.get("attempt"),
                traceback=str(rec.get("traceback", "")),
                time=float(rec.get("time") or 0.0),
                relaunch=int(rec.get("relaunch") or 0),
            )
        )
    failures.sort(key=lambda f: (-(f.attempt or 0), -f.relaunch, is_collateral(f), f.time, f.rank))
    return failures


def is_collateral(failure: Failure) -> bool:
    """A peer's error (a connection closed or reset, a collective timed out): the rank
    failed because another one did (``policy.attribution`` holds the words)."""
    return attribution.is_collateral(failure.message, failure.exception)


def unusable_failures(run_dir: Path) -> list[records.Problem]:
    """The rank records ``read_failures`` skips because they cannot be used, and why."""
    problems = []
    for path in sorted((run_dir / FAILURES_DIR).glob("rank-*.json")):
        name = f"{FAILURES_DIR}/{path.name}"
        found, problem = records.load_json(path, dict, name=name)
        problems += [problem] if problem else records.clean(found or {}, FIELDS, name)
    return problems
