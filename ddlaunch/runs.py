"""Reading runs back from their run directories (torch-free; used by status, logs, cancel).

The run directory is the source of truth: job ids, attempts, failures, results and
checkpoints are all read from files there. Slurm is asked only for the live state.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.errors import UserError
from ddlaunch.rundir import DEFAULT_RUN_ROOT, resolve_run_root


def default_run_root() -> Path:
    """The run root when no config names one: $DDLAUNCH_RUN_ROOT or the built-in default."""
    return resolve_run_root(DEFAULT_RUN_ROOT)


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by path, by id under the run root, or by a unique id prefix."""
    as_path = Path(ref).expanduser()
    root = root or default_run_root()
    # A sweep member that has not started has no run directory yet: create it from the
    # sweep's records, as its array task would (logs, cancel and resume need it).
    from ddlaunch.sweep_members import ensure_member_dir

    ensure_member_dir(as_path) or ensure_member_dir(root / ref)
    if (as_path / "config.yaml").is_file():
        return as_path.absolute()
    if (root / ref / "config.yaml").is_file():
        return root / ref
    matches = sorted(p for p in root.glob(f"{ref}*") if (p / "config.yaml").is_file())
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(
            f"no run {ref!r} (looked for a run directory at that path and under "
            f"{root}; set DDLAUNCH_RUN_ROOT or pass the run directory)"
        )
    names = ", ".join(p.name for p in matches[:5])
    raise UserError(f"{ref!r} matches {len(matches)} runs ({names}...); give more of the id")


def list_runs(root: Path | None = None) -> list[Path]:
    root = root or default_run_root()
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / "config.yaml").is_file()]
    return sorted(runs, key=lambda p: p.stat().st_mtime)


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

    def one_line(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"rank {self.rank} on {self.host}: {self.exception}: {self.message}{loc}"


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
    progress: dict[str, Any] | None = None
    excluded: list[str] = field(default_factory=list)
    preflight: dict[str, Any] | None = None  # health/preflight.json: the latest verdicts
    watchdog: dict[str, Any] | None = None  # health/watchdog.json: heartbeat summary
    label: str | None = None  # a sweep member's overrides

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


def read_failures(run_dir: Path) -> list[Failure]:
    failures = []
    for path in sorted((run_dir / "failures").glob("rank-*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
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
            )
        )
    # The cause comes first: the newest attempt, then real errors before collateral ones
    # (a peer's "connection closed" / timeout in a collective), then the earliest.
    failures.sort(key=lambda f: (-(f.attempt or 0), is_collateral(f), f.time, f.rank))
    return failures


# Messages of ranks that failed only because a peer died or hung in a collective.
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Socket Timeout|"
    r"timed out|Timeout|NCCL (communicator|error).*(abort|remote)|ProcessGroup.*(abort|timeout)",
    re.IGNORECASE,
)


def is_collateral(failure: Failure) -> bool:
    return bool(_COLLATERAL.search(failure.message))


def checkpoint_root(run_dir: Path) -> Path:
    """The run's checkpoint directory: ``storage.checkpoint_dir`` or ``<run dir>/checkpoints``.

    ``status`` reads this for every run it shows, so the common case (the key unset, written
    by ``yaml.safe_dump`` as ``checkpoint_dir: null``) is recognised from the text without a
    YAML parse; anything else is parsed properly.
    """
    text = (run_dir / "config.yaml").read_text()
    if text.count("checkpoint_dir:") == 1 and "  checkpoint_dir: null\n" in text:
        return run_dir / "checkpoints"
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    tree = yaml.load(text, Loader=loader) or {}  # a safe loader (C or pure Python)
    configured = (tree.get("storage") or {}).get("checkpoint_dir")
    return Path(configured) if configured else run_dir / "checkpoints"


def _json(path: Path, present: set[str], name: str, default: Any = None) -> Any:
    # One directory listing per run tells which files exist: status reads hundreds of run
    # directories per poll, and failed opens of absent files are most of the cost otherwise.
    if name not in present:
        return default
    try:
        return fsutil.read_json(path / name, default)
    except ValueError:
        return default


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
    submission = _json(run_dir, present, "submission.json", {}) or {}
    info = RunInfo(path=run_dir, run_id=run_dir.name, job_ids=list(submission.get("job_ids", [])))
    info.intent = _json(run_dir, present, "intent.json", {}) or {}
    info.failures = read_failures(run_dir) if "failures" in present else []
    info.result = _json(run_dir, present, "result.json")
    info.attempts = list(_json(run_dir, present, "attempts.json", []) or [])
    info.outcome = _json(run_dir, present, "outcome.json")
    info.progress = _json(run_dir, present, "progress.json")
    info.excluded = list(_json(run_dir, present, "excluded_nodes.json", []) or [])
    if "health" in present:
        health = run_dir / "health"
        info.preflight = _json(health, {"preflight.json"}, "preflight.json")
        info.watchdog = _json(health, {"watchdog.json"}, "watchdog.json")
    # A run that never started has no checkpoint: skip the config read for pending runs
    # (most of a large sweep's members while it is queued).
    started = present & {"attempts.json", "progress.json", "result.json", "outcome.json"}
    if with_checkpoints and "config.yaml" in present and (started or "checkpoints" in present):
        info.checkpoint_root = checkpoint_root(run_dir)
        root = info.checkpoint_root
        if root.parent != run_dir or root.name in present:
            from ddlaunch.checkpoint.layout import latest_complete

            latest = latest_complete(root) if root.is_dir() else None
            info.latest_step = latest.step if latest else None
    return info


STATUS_CACHE = ".ddlaunch-status-cache.json"
# Names whose presence means a run started (or was acted on): such runs are always read.
_ACTIVITY = frozenset(
    {
        "attempts.json",
        "progress.json",
        "result.json",
        "outcome.json",
        "failures",
        "health",
        "checkpoints",
        "cancel.json",
        "excluded_nodes.json",
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

    def get(self, run_dir: Path, mtime_ns: int) -> RunInfo | None:
        entry = self.runs.get(run_dir.name)
        if not entry or entry[0] != mtime_ns:
            return None
        intent = {k: v for k, v in (("state", entry[2]), ("error", entry[3])) if v is not None}
        return RunInfo(path=run_dir, run_id=run_dir.name, job_ids=list(entry[1]), intent=intent)

    def put(self, info: RunInfo, mtime_ns: int, listing: AbstractSet[str], now: float) -> None:
        name = info.path.name
        if listing & _ACTIVITY or now - mtime_ns / 1e9 < _SETTLE_S:
            if self.runs.pop(name, None) is not None:
                self.changed = True
            return
        entry = [mtime_ns, info.job_ids, info.intent.get("state"), info.intent.get("error")]
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
        hit = cache.get(run_dir, mtime_ns)
        if hit is not None:
            return hit
        try:
            listing = set(os.listdir(run_dir))
        except OSError:
            listing = set()
        info = read_run(run_dir, listing=listing)
        cache.put(info, mtime_ns, listing, self.now)
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
        kind = "run" if "config.yaml" in listing else "sweep" if "members.json" in listing else ""
        if kind:
            out.append((mtime_ns, name, kind, path))
    out.sort(key=lambda entry: entry[:2])
    return [(kind, path, mtime_ns) for mtime_ns, _, kind, path in out]


def rank_log(run_dir: Path, rank: int, stream: str = "out") -> Path:
    return run_dir / "logs" / f"rank-{rank}.{stream}"


def batch_logs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "logs").glob("batch-*.out"), key=os.path.getmtime)
