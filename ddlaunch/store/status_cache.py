"""``.ddlaunch-status-cache.json`` (in the run root and in each sweep directory): what
``status`` learnt about runs that have not started yet. Only a cache: unreadable or stale,
it is rebuilt."""

from __future__ import annotations

import json
import os
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from ddlaunch.store.attempts import ATTEMPTS_FILE
from ddlaunch.store.exclusions import EXCLUDED_FILE
from ddlaunch.store.failures import FAILURES_DIR
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.preflight import HEALTH_DIR
from ddlaunch.store.progress import PROGRESS_FILE, RESULT_FILE
from ddlaunch.store.rundir import CHECKPOINTS_DIR

STATUS_CACHE = ".ddlaunch-status-cache.json"
# Names whose presence means a run started (or was acted on): such runs are always read.
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


class QueuedRunCache:
    """What ``status`` learnt about runs that have not started yet, keyed by the run
    directory's mtime (``<dir>/.ddlaunch-status-cache.json``).

    A queued run holds only what ``submit`` wrote (job ids, intent). Every later write into
    the run directory (``attempts.json`` at the first start, ...) is a rename there and
    changes the directory's mtime, so one stat tells whether the cached record still holds:
    a 1000-member sweep waiting in the queue costs 1000 stats per poll instead of 1000
    listings and file reads. Runs that started are never cached. The file is only a cache:
    unreadable or stale, it is rebuilt."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATUS_CACHE
        self.runs: dict[str, list[Any]] = {}
        self.changed = False
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("version") == 1:
                self.runs = dict(data.get("runs", {}))
        except (OSError, ValueError):
            pass

    def get(self, name: str, mtime_ns: int) -> tuple[list[str], dict[str, Any]] | None:
        """(job ids, intent) of the queued run ``name`` if its directory is unchanged."""
        entry = self.runs.get(name)
        if not entry or entry[0] != mtime_ns:
            return None
        intent = {k: v for k, v in (("state", entry[2]), ("error", entry[3])) if v is not None}
        return list(entry[1]), intent

    def put(
        self,
        name: str,
        mtime_ns: int,
        listing: AbstractSet[str],
        now: float,
        job_ids: list[str],
        intent: dict[str, Any],
    ) -> None:
        if listing & ACTIVITY or now - mtime_ns / 1e9 < _SETTLE_S:
            if self.runs.pop(name, None) is not None:
                self.changed = True
            return
        entry = [mtime_ns, job_ids, intent.get("state"), intent.get("error")]
        if self.runs.get(name) != entry:
            self.runs[name] = entry
            self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            # No fsync: losing the cache only costs the next poll a full read.
            tmp.write_text(json.dumps({"version": 1, "runs": self.runs}))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
        self.changed = False
