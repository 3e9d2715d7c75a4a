"""``.ddlaunch-status-cache.json`` (in the run root and in each sweep's ``members/``): what
``status`` learnt about runs that cannot change until their directory does: runs waiting in
the queue (their job ids and intent) and runs that ended (their final state). Only a cache:
unreadable or stale, it is rebuilt."""

from __future__ import annotations

import json
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.store.attempts import ATTEMPTS_FILE
from ddlaunch.store.exclusions import EXCLUDED_FILE
from ddlaunch.store.failures import FAILURES_DIR
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.preflight import HEALTH_DIR
from ddlaunch.store.progress import PROGRESS_FILE, RESULT_FILE
from ddlaunch.store.rundir import CHECKPOINTS_DIR
from ddlaunch.store.submission import Intent

STATUS_CACHE = ".ddlaunch-status-cache.json"
VERSION = 2
# Names whose presence means a run started (or was acted on): such runs are never cached as
# queued.
ACTIVITY = frozenset(
    {
        ATTEMPTS_FILE,
        PROGRESS_FILE,
        RESULT_FILE,
        OUTCOME_FILE,
        FAILURES_DIR,
        HEALTH_DIR,
        CHECKPOINTS_DIR,
        CANCEL_FILE,
        EXCLUDED_FILE,
    }
)
# A directory changed this recently is not cached: on filesystems with coarse timestamps a
# write in the same tick would not change its mtime again.
_SETTLE_S = 2.0


def _optional(*kinds: type) -> Any:
    return lambda v: v is None or (isinstance(v, kinds) and not isinstance(v, bool))


# The entries as ``put`` and ``put_final`` write them: anything else is a damaged cache.
_QUEUED = (
    _optional(int),
    lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
    _optional(str),
    _optional(str),
    _optional(int, float),
)
_FINAL = (_optional(int), lambda v: isinstance(v, str), _optional(int, float))


def _table(table: Any, shape: tuple[Any, ...]) -> bool:
    return isinstance(table, dict) and all(
        isinstance(e, list)
        and len(e) == len(shape)
        and all(ok(v) for ok, v in zip(shape, e, strict=True))
        for e in table.values()
    )


@dataclass(frozen=True)
class Queued:
    """``intent``: its state and error only (what ``status`` shows of a queued run)."""

    job_ids: list[str]
    intent: Intent | None
    submitted: float | None


@dataclass(frozen=True)
class Final:
    state: str
    submitted: float | None


class StatusCache:
    """What ``status`` learnt about the runs of one directory, keyed by each run directory's
    mtime (``<dir>/.ddlaunch-status-cache.json``).

    Every write into a run directory (``attempts.json`` at a start, ``outcome.json`` at the
    end, ``resume`` rewriting the config) is a rename there and changes the directory's
    mtime, so one stat tells whether a cached record still holds:

    * a **queued** run holds only what ``submit`` wrote (job ids, intent): a 1000-member
      sweep waiting in the queue costs 1000 stats per poll instead of 1000 listings and file
      reads. Runs that started are never cached as queued;
    * a run that **ended** keeps its final state: it is read once, and a poll then costs
      what the active runs cost, however many finished runs the run root holds. A final
      state never changes while its directory does not (a controller that forgot the job,
      or accounting that is down, cannot turn a CANCELLED run into anything else)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATUS_CACHE
        self.runs: dict[str, list[Any]] = {}  # queued: [mtime_ns, job ids, state, error, t]
        self.final: dict[str, list[Any]] = {}  # ended: [mtime_ns, state, submitted]
        self.changed = False
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("version") == VERSION:
                runs, final = data.get("runs", {}), data.get("final", {})
                if _table(runs, _QUEUED) and _table(final, _FINAL):  # else: rebuilt
                    self.runs, self.final = dict(runs), dict(final)
        except (OSError, ValueError):
            pass

    def known(self, name: str) -> bool:
        """Whether ``name`` is a run this cache has seen (no need to look what it is)."""
        return name in self.runs or name in self.final

    def get(self, name: str, mtime_ns: int) -> Queued | None:
        """The queued run ``name`` if its directory is unchanged."""
        entry = self.runs.get(name)
        if not entry or entry[0] != mtime_ns:
            return None
        state, error = entry[2], entry[3]
        intent = None if state is None and error is None else Intent(state=state, error=error)
        return Queued(list(entry[1]), intent, entry[4])

    def get_final(self, name: str, mtime_ns: int) -> Final | None:
        """The final state of the run ``name`` if its directory is unchanged."""
        entry = self.final.get(name)
        if not entry or entry[0] != mtime_ns:
            return None
        return Final(str(entry[1]), entry[2])

    def _settled(self, mtime_ns: int, now: float) -> bool:
        return now - mtime_ns / 1e9 >= _SETTLE_S

    def put(
        self,
        name: str,
        mtime_ns: int,
        listing: AbstractSet[str],
        now: float,
        queued: Queued,
    ) -> None:
        if listing & ACTIVITY or not self._settled(mtime_ns, now):
            if self.runs.pop(name, None) is not None:
                self.changed = True
            return
        intent = queued.intent or Intent()
        entry = [mtime_ns, queued.job_ids, intent.state, intent.error, queued.submitted]
        if self.runs.get(name) != entry:
            self.runs[name] = entry
            self.changed = True

    def put_final(self, name: str, mtime_ns: int, now: float, final: Final) -> None:
        if not self._settled(mtime_ns, now):
            return
        entry = [mtime_ns, final.state, final.submitted]
        if self.final.get(name) != entry:
            self.final[name] = entry
            self.runs.pop(name, None)
            self.changed = True

    def forget(self, name: str) -> None:
        """Hold nothing about ``name`` (its records could not be read)."""
        for table in (self.runs, self.final):
            if table.pop(name, None) is not None:
                self.changed = True

    def keep_only(self, names: AbstractSet[str]) -> None:
        """Forget the runs not among ``names`` (a whole listing of the directory): removed
        run directories must not grow the cache forever."""
        for table in (self.runs, self.final):
            gone = [name for name in table if name not in names]
            for name in gone:
                del table[name]
            self.changed = self.changed or bool(gone)

    def save(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            # No fsync: losing the cache only costs the next poll a full read.
            doc = {"version": VERSION, "runs": self.runs, "final": self.final}
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
        self.changed = False
