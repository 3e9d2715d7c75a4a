"""Finding runs and reading them back from their run directories (login node, torch-free;
used by status, logs, cancel, resume, report).

The run directory is the source of truth: job ids, attempts, failures, results and
checkpoints are all read from files there. Slurm is asked only for the live state.
"""

from __future__ import annotations

import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.errors import UserError
from ddlaunch.store import exclusions, outcome, preflight, progress, staging, submission, watchdog
from ddlaunch.store.attempts import ATTEMPTS_FILE
from ddlaunch.store.failures import FAILURES_DIR, Failure, read_failures
from ddlaunch.store.members import ensure_member_dir, member_of
from ddlaunch.store.rundir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    checkpoint_source,
    default_run_root,
    is_run_dir,
    latest_checkpoint,
)
from ddlaunch.store.snapshots import SNAPSHOT_FILE
from ddlaunch.store.status_cache import QueuedRunCache
from ddlaunch.store.sweeps import MEMBERS_FILE, member_jobs


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by path, by id under the run root, or by a unique id prefix. Only reads: a
    sweep member that has not started has no run directory yet (``ensure_member_dir``
    creates it for the commands that need one)."""
    as_path = Path(ref).expanduser()
    root = root or default_run_root()
    if is_run_dir(as_path):
        return as_path.absolute()
    if is_run_dir(root / ref):
        return root / ref
    matches = sorted(p for p in root.glob(f"{ref}*") if is_run_dir(p))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(
            f"no run {ref!r} (looked for a run directory at that path and under "
            f"{root}; set DDLAUNCH_RUN_ROOT or pass the run directory)"
        )
    names = ", ".join(p.name for p in matches[:5])
    raise UserError(f"{ref!r} matches {len(matches)} runs ({names}...); give more of the id")


def find_run_materialized(ref: str, root: Path | None = None) -> Path:
    """``find_run`` for commands that act on a run (cancel, resume, logs): a sweep member
    that has not started gets its run directory first, from the sweep's records, as its
    array task would create it."""

    root = root or default_run_root()
    ensure_member_dir(Path(ref).expanduser()) or ensure_member_dir(root / ref)
    return find_run(ref, root)


def list_runs(root: Path | None = None) -> list[Path]:
    root = root or default_run_root()
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if is_run_dir(p)]
    return sorted(runs, key=lambda p: p.stat().st_mtime)


@dataclass
class RunInfo:
    path: Path
    run_id: str
    job_ids: list[str] = field(default_factory=list)
    intent: dict[str, Any] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    result: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    checkpoint_root: Path | None = None
    latest_step: int | None = None
    latest_checkpoint: Path | None = None  # the entry the latest step is in
    trainer: str | None = None  # trainer.kind
    progress: dict[str, Any] | None = None
    excluded: list[str] = field(default_factory=list)
    preflight: dict[str, Any] | None = None  # health/preflight.json: the latest verdicts
    watchdog: dict[str, Any] | None = None  # health/watchdog.json: heartbeat summary
    staging: dict[str, dict[str, Any]] | None = None  # the last attempt's, host -> record
    label: str | None = None  # a sweep member's overrides
    snapshot: str | None = None  # the code snapshot's id (snapshot.json)

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


def _json(path: Path, present: AbstractSet[str], name: str, default: Any = None) -> Any:
    # One directory listing per run tells which files exist: status reads hundreds of run
    # directories per poll, and failed opens of absent files are most of the cost otherwise.
    if name not in present:
        return default
    try:
        return fsutil.read_json(path / name, default)
    except ValueError:
        return default


def _read(path: Path) -> Any:
    try:
        return fsutil.read_json(path)
    except ValueError:
        return None


def read_run(
    run_dir: Path, *, with_checkpoints: bool = True, listing: AbstractSet[str] | None = None
) -> RunInfo:
    """Everything status needs from a run directory; ``listing`` (its file names) may come
    from the caller, who listed it already."""
    present: AbstractSet[str]
    if listing is not None:
        present = listing
    else:
        try:
            present = set(os.listdir(run_dir))
        except OSError:
            present = set()
    record = _json(run_dir, present, submission.SUBMISSION_FILE, {}) or {}
    info = RunInfo(path=run_dir, run_id=run_dir.name, job_ids=list(record.get("job_ids", [])))
    info.intent = _json(run_dir, present, submission.INTENT_FILE, {}) or {}
    info.failures = read_failures(run_dir) if FAILURES_DIR in present else []
    info.result = _json(run_dir, present, progress.RESULT_FILE)
    info.attempts = list(_json(run_dir, present, ATTEMPTS_FILE, []) or [])
    info.outcome = _json(run_dir, present, outcome.OUTCOME_FILE)
    info.progress = _json(run_dir, present, progress.PROGRESS_FILE)
    info.excluded = list(_json(run_dir, present, exclusions.EXCLUDED_FILE, []) or [])
    snapshot = _json(run_dir, present, SNAPSHOT_FILE)
    info.snapshot = str(snapshot.get("id")) if isinstance(snapshot, dict) else None
    if preflight.HEALTH_DIR in present:
        info.preflight = _read(preflight.latest_path(run_dir))
        info.watchdog = _read(watchdog.summary_path(run_dir))
    if staging.STAGING_DIR in present:
        info.staging = latest_staging(run_dir, info.attempts)
    # A run that never started has no checkpoint: skip the config read for pending runs
    # (most of a large sweep's members while it is queued).
    started = present & {
        ATTEMPTS_FILE,
        progress.PROGRESS_FILE,
        progress.RESULT_FILE,
        outcome.OUTCOME_FILE,
    }
    if with_checkpoints and CONFIG_FILE in present and (started or CHECKPOINTS_DIR in present):
        source = checkpoint_source(run_dir)
        info.checkpoint_root, info.trainer = source.root, source.kind
        root = source.root
        if root.parent != run_dir or root.name in present:
            latest = latest_checkpoint(run_dir, source)
            if latest is not None:
                info.latest_step, info.latest_checkpoint = latest.step, latest.path
    return info


def latest_staging(run_dir: Path, attempts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The staging records of the newest attempt that staged (host -> record)."""
    every = staging.read_all(run_dir)
    for rec in reversed(attempts):
        key = f"{rec.get('job_id')}-{rec.get('restart_count', 0) or 0}"
        if key in every:
            return every[key]
    return every[max(every)] if every else {}


class RunReader:
    """``read_run`` with the queued-run cache of each parent directory (run root, sweep)."""

    def __init__(self, clock: Any = None) -> None:
        import time

        self.now = (clock or time.time)()
        # Keyed by the parent's path as a string: hashing a Path costs more than the lookup.
        self.caches: dict[str, QueuedRunCache] = {}

    def cache(self, parent: Path) -> QueuedRunCache:
        key = str(parent)
        cache = self.caches.get(key)
        if cache is None:
            cache = self.caches[key] = QueuedRunCache(parent)
        return cache

    def read(self, run_dir: Path, mtime_ns: int | None = None) -> RunInfo:
        """``mtime_ns``: the directory's mtime when the caller has stat'ed it already."""
        if mtime_ns is None:
            try:
                mtime_ns = os.stat(run_dir).st_mtime_ns
            except OSError:
                return read_run(run_dir)
        cache = self.cache(run_dir.parent)
        hit = cache.get(run_dir.name, mtime_ns)
        if hit is not None:
            return RunInfo(path=run_dir, run_id=run_dir.name, job_ids=hit[0], intent=hit[1])
        try:
            listing = set(os.listdir(run_dir))
        except OSError:
            listing = set()
        info = read_run(run_dir, listing=listing)
        cache.put(run_dir.name, mtime_ns, listing, self.now, info.job_ids, info.intent)
        return info

    def save(self) -> None:
        for cache in self.caches.values():
            cache.save()


def list_targets(
    root: Path | None = None, reader: RunReader | None = None
) -> list[tuple[str, Path, int]]:
    """Runs and sweeps under the run root, oldest first: ("run" | "sweep", path, mtime_ns).

    Entries the queued-run cache knows are runs without a further look; the others are
    listed once to tell a run (config.yaml) from a sweep (members.json). ``reader`` shares
    its already loaded cache. The mtime is returned so that the reader need not stat again.
    """
    root = root or default_run_root()
    try:
        # iterdir, not scandir: it builds child paths without re-parsing them, which is most
        # of the per-entry cost of a Path; the stat is one syscall either way.
        entries = list(root.iterdir())
    except OSError:
        return []
    known = (reader.cache(root) if reader is not None else QueuedRunCache(root)).runs
    out = []
    for path in entries:
        name = path.name
        if name.startswith("."):
            continue
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            continue
        if name in known:
            out.append((mtime_ns, name, "run", path))
            continue
        try:
            listing = set(os.listdir(path))
        except OSError:  # not a directory, or gone meanwhile
            continue
        kind = "run" if CONFIG_FILE in listing else "sweep" if MEMBERS_FILE in listing else ""
        if kind:
            out.append((mtime_ns, name, kind, path))
    out.sort(key=lambda entry: entry[:2])
    return [(kind, path, mtime_ns) for mtime_ns, _, kind, path in out]


def complete_member_info(info: RunInfo) -> RunInfo:
    """``ddlaunch status`` for a member that has not started yet: its run directory does
    not exist, so take its job ids (or its failed submission) from the arrays' records.
    ``info`` is read from ``<sweep>/members/<i>``; returned completed
    (unchanged for anything else)."""
    if info.job_ids or info.intent:
        return info
    found = member_of(info.path)
    if found is None:
        return info
    jobs = member_jobs(found[0]).get(found[1])
    if jobs is None:
        return info
    info.job_ids = list(jobs.job_ids)
    if jobs.state == "failed":
        info.intent = {"state": "failed", "error": jobs.error}
    return info
