"""Finding runs and reading them back from their run directories (login node, torch-free;
used by status, logs, cancel, resume, report).

The run directory is the source of truth: job ids, attempts, failures, results and
checkpoints are all read from files there. Slurm is asked only for the live state.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ddlaunch.errors import UserError
from ddlaunch.store import (
    attempts,
    balance,
    exclusions,
    group_state,
    outcome,
    preflight,
    progress,
    records,
    snapshots,
    staging,
    submission,
    watchdog,
)
from ddlaunch.store.attempts import ATTEMPTS_FILE, AttemptRecord
from ddlaunch.store.balance import BALANCE_FILE, BalanceRecord
from ddlaunch.store.chain import AFTER_FILE, PredecessorRecord, read_after
from ddlaunch.store.components import COMPONENTS_DIR, ServiceState
from ddlaunch.store.components import read_all as read_services
from ddlaunch.store.failures import FAILURES_DIR, Failure, read_failures, unusable_failures
from ddlaunch.store.layout import ARRAYS_DIR
from ddlaunch.store.members import ensure_member_dir, member_of
from ddlaunch.store.outcome import Outcome
from ddlaunch.store.pipelines import PIPELINE_FILE, is_pipeline_dir, read_pipeline
from ddlaunch.store.preflight import LatestVerdicts
from ddlaunch.store.progress import Progress
from ddlaunch.store.rundir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    SCRIPT_FILE,
    checkpoint_source,
    default_run_root,
    is_run_dir,
    latest_checkpoint,
)
from ddlaunch.store.snapshots import SNAPSHOT_FILE
from ddlaunch.store.staging import NodeStaging
from ddlaunch.store.standbys import STANDBYS_FILE, StandbyBook
from ddlaunch.store.standbys import read as read_standbys
from ddlaunch.store.status_cache import Final, Queued, StatusCache
from ddlaunch.store.submission import Intent, Submission
from ddlaunch.store.sweep_cancels import is_cancelled
from ddlaunch.store.sweeps import (
    MEMBERS_DIR,
    MEMBERS_FILE,
    is_sweep_dir,
    member_jobs,
    member_overrides,
    read_members,
)
from ddlaunch.store.watchdog import Summary


def member_path(ref: str, root: Path) -> Path | None:
    """``SWEEP/7`` (as ``status`` prints a member; SWEEP may be a unique id prefix) ->
    ``<root>/SWEEP/members/7``, whether or not the member has started; else None."""
    sweep_ref, sep, index = ref.rpartition("/")
    if not sep or not index.isdigit() or not sweep_ref:
        return None
    for candidate in (Path(sweep_ref).expanduser(), root / sweep_ref):
        if is_sweep_dir(candidate):
            return candidate.absolute() / MEMBERS_DIR / index
    if "/" in sweep_ref:
        return None
    matches = [p for p in root.glob(f"{sweep_ref}*") if is_sweep_dir(p)] if root.is_dir() else []
    return matches[0] / MEMBERS_DIR / index if len(matches) == 1 else None


# The runs an ambiguous prefix error names before it counts the rest.
MATCHES_SHOWN = 5


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by path, by id under the run root, by a unique id prefix, by a shortened id as
    ``status`` shows it (``prefix…suffix``), or a sweep member as ``SWEEP/<i>``. Only
    reads: a sweep member that has not started has no run directory yet (``find_member``,
    ``find_run_materialized``)."""
    as_path = Path(ref).expanduser()
    root = root or default_run_root()
    if is_run_dir(as_path):
        return as_path.absolute()
    if is_run_dir(root / ref):
        return root / ref
    member = member_path(ref, root)
    if member is not None and is_run_dir(member):
        return member
    # What `status` puts in the middle of an id it shortened (cli.table.ELLIPSIS).
    head, shortened, tail = ref.partition("\u2026")
    if "/" in ref:
        matches = []
    elif shortened:  # `status` shortened the id to fit: the ids with that head and tail
        matches = sorted(
            p
            for p in root.glob(f"{glob.escape(head)}*")
            if p.name.endswith(tail) and len(p.name) > len(head) + len(tail) and is_run_dir(p)
        )
    else:
        matches = sorted(p for p in root.glob(f"{ref}*") if is_run_dir(p))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        _not_a_run(ref, root)
        near = _near(ref, root) if "/" not in ref else []
        meant = f"; did you mean {' or '.join(near)}?" if near else ""
        raise UserError(
            f"no run {ref!r}{meant} (looked for a run directory at that path and under "
            f"{root}; set DDLAUNCH_RUN_ROOT or pass the run directory)"
        )
    raise UserError(ambiguous_prefix(ref, [], [p.name for p in matches]))


# How close a mistyped prefix must be to a run id's start to be offered: one letter left
# out, added, swapped or mistyped in a name of 5 or more.
NEAR = 0.8


def _near(ref: str, root: Path, most: int = 3) -> list[str]:
    """Run ids under ``root`` that a mistyped prefix ``ref`` was probably meant to begin:
    the id's start of about the same length is close to it (a letter left out, swapped or
    mistyped). Read only when nothing matched, so its cost is the error's."""
    import difflib  # lazy: only a miss pays for it

    try:
        names = [p.name for p in root.iterdir() if is_run_dir(p)]
    except OSError:
        return []
    scored = []
    matcher = difflib.SequenceMatcher(None, "", ref)  # ref is the side it caches
    for name in names:
        best = 0.0
        for size in range(max(1, len(ref) - 2), len(ref) + 3):
            matcher.set_seq1(name[:size])
            if matcher.quick_ratio() >= NEAR:  # an upper bound of ratio(), and cheap
                best = max(best, matcher.ratio())
        if best >= NEAR:
            scored.append((-best, name))
    return [name for _, name in sorted(scored)[:most]]


def ambiguous_prefix(ref: str, sweep_ids: Sequence[str], run_ids: Sequence[str]) -> str:
    """``'s' matches 1 sweep and 2 runs (sw, sx, sy); give more of the id``."""

    def count(n: int, what: str) -> str:
        return f"{n} {what}" if n == 1 else f"{n} {what}s"

    kinds = [count(len(ids), what) for ids, what in ((sweep_ids, "sweep"), (run_ids, "run")) if ids]
    names = sorted([*sweep_ids, *run_ids])
    shown = ", ".join(names[:MATCHES_SHOWN])
    more = f", and {len(names) - MATCHES_SHOWN} more" if len(names) > MATCHES_SHOWN else ""
    return f"{ref!r} matches {' and '.join(kinds)} ({shown}{more}); give more of the id"


def _a_pipeline(ref: str, path: Path) -> NoReturn:
    """A pipeline named where a run is expected: its stages' runs are what to name."""
    found = read_pipeline(path)
    stages = [
        f"{s.name} ({s.run_id})" if s.run_id else f"{s.name} (not submitted)"
        for s in (found.stages if found is not None else ())
    ]
    listed = f": {', '.join(stages)}" if stages else ""
    raise UserError(
        f"{ref!r} is a pipeline, not a run: name one of its stages' runs{listed} "
        f"(ddlaunch status {path.name} shows them)"
    )


def _not_a_run(ref: str, root: Path) -> None:
    """A sweep, or a member that has not started, named where a run is expected: say how
    to reach it instead of "no run"."""
    candidates = [Path(ref).expanduser(), root / ref]
    if "/" not in ref and root.is_dir():
        candidates += [p for p in root.glob(f"{ref}*") if is_sweep_dir(p)][:2]
    if "/" not in ref and root.is_dir():
        candidates += [p for p in root.glob(f"{ref}*") if is_pipeline_dir(p)][:2]
    pipelines = {c.absolute() for c in candidates if is_pipeline_dir(c)}
    if len(pipelines) == 1:
        _a_pipeline(ref, pipelines.pop())
    sweeps = {c.absolute() for c in candidates if is_sweep_dir(c)}
    if len(sweeps) == 1:
        name = sweeps.pop().name
        raise UserError(
            f"{ref!r} is a sweep, not a run: see its members with `ddlaunch sweep status "
            f"{name}`, and name one as {name}/<i> (e.g. {name}/0)"
        )
    member = member_path(ref, root)
    if member is None:
        return
    _no_member_run(member.parent.parent, int(member.name))


def _no_member_run(sweep_dir: Path, index: int) -> NoReturn:
    """Why member ``index`` of the sweep in ``sweep_dir`` has no run directory: it has not
    started, or the sweep has no such member."""
    count = len(member_overrides(read_members(sweep_dir)))
    if 0 <= index < count:
        raise UserError(
            f"member {index} of sweep {sweep_dir.name} has not started: it has no run "
            f"directory yet (ddlaunch sweep status {sweep_dir.name})"
        )
    raise UserError(f"sweep {sweep_dir.name} has no member {index} (members 0-{count - 1})")


def sweep_member(sweep_dir: Path, index: int) -> Path:
    """The run directory of member ``index`` of the sweep in ``sweep_dir`` (members are
    numbered from 0, as ``SWEEP/<i>``); ``UserError`` as ``SWEEP/<i>`` gets it where there is
    none."""
    path = sweep_dir.absolute() / MEMBERS_DIR / str(index)
    if index >= 0 and is_run_dir(path):
        return path
    _no_member_run(sweep_dir, index)


def find_member(ref: str, root: Path | None = None) -> Path | None:
    """A sweep member named by ``ref`` (``SWEEP/<i>`` or its directory) that has no run
    directory yet, because it has not started; None for anything else."""
    root = root or default_run_root()
    for candidate in (member_path(ref, root), Path(ref).expanduser().absolute(), root / ref):
        if candidate is None or is_run_dir(candidate):
            continue
        found = member_of(candidate)
        if found is not None and found[1] in member_jobs(found[0]):
            return candidate
    return None


def find_run_materialized(ref: str, root: Path | None = None) -> Path:
    """``find_run`` for commands that need a run directory to act on (resume, logs): a
    sweep member that has not started gets its run directory first, from the sweep's
    records, as its array task would create it."""

    root = root or default_run_root()
    member = member_path(ref, root)
    for candidate in (member, Path(ref).expanduser(), root / ref):
        if candidate is not None and ensure_member_dir(candidate):
            break
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
    intent: Intent | None = None  # intent.json
    failures: list[Failure] = field(default_factory=list)
    result: dict[str, object] | None = None  # result.json: the training code's own values
    attempts: list[AttemptRecord] = field(default_factory=list)
    outcome: Outcome | None = None
    checkpoint_root: Path | None = None
    latest_step: int | None = None
    latest_checkpoint: Path | None = None  # the entry the latest step is in
    trainer: str | None = None  # trainer.kind
    progress: Progress | None = None
    excluded: list[str] = field(default_factory=list)
    preflight: LatestVerdicts | None = None  # health/preflight.json: the latest verdicts
    watchdog: Summary | None = None  # health/watchdog.json: heartbeat summary
    staging: dict[str, NodeStaging] | None = None  # the last attempt's, host -> record
    label: str | None = None  # a sweep member's overrides
    snapshot: str | None = None  # the code snapshot's id (snapshot.json)
    submitted: float | None = None  # when it was last submitted (or started, if local)
    cancel_requested: bool = False  # cancel.json: `ddlaunch cancel` asked for it
    mtime_ns: int | None = None  # the directory's, when read through RunReader
    problems: list[str] = field(default_factory=list)  # "unreadable <record>: <reason>"
    groups: group_state.GroupsState | None = None  # replica groups: the supervisor's view
    standbys: StandbyBook | None = None  # restart: in_process: the standbys (standbys.json)
    after: list[PredecessorRecord] = field(default_factory=list)  # submit --after (after.json)
    balance: BalanceRecord | None = None  # balance.json: the ranks' shares of the batch
    services: list[ServiceState] = field(default_factory=list)  # components: role service

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None

    @property
    def submit_failed(self) -> bool:
        """Its (last) submission failed: the intent says so."""
        return self.intent is not None and self.intent.failed


def read_run(
    run_dir: Path, *, with_checkpoints: bool = True, listing: AbstractSet[str] | None = None
) -> RunInfo:
    """Everything status needs from a run directory; ``listing`` (its file names) may come
    from the caller, who listed it already. Each record is read on its own
    (``store.records.Reader``): one that cannot be used is left out and said in
    ``RunInfo.problems``, the others still count."""
    present: AbstractSet[str]
    if listing is not None:
        present = listing
    else:
        try:
            present = set(os.listdir(run_dir))
        except OSError:
            present = set()
    rec = records.Reader(run_dir, present)
    record = Submission.from_json(
        rec.json(submission.SUBMISSION_FILE, dict, {}, submission.SUBMISSION_FIELDS)
    )
    info = RunInfo(path=run_dir, run_id=run_id(run_dir), job_ids=list(record.job_ids or ()))
    found_intent = rec.json(submission.INTENT_FILE, dict, {}, submission.INTENT_FIELDS)
    info.intent = Intent.from_json(found_intent) if found_intent else None
    if FAILURES_DIR in present:
        rec.problems += unusable_failures(run_dir)
        info.failures = read_failures(run_dir)
    info.result = rec.json(progress.RESULT_FILE, dict)
    info.attempts = [
        AttemptRecord.from_json(a) for a in rec.items(ATTEMPTS_FILE, attempts.FIELDS, "attempt")
    ]
    found = rec.json(outcome.OUTCOME_FILE, dict, None, outcome.FIELDS)
    info.outcome = None if found is None else Outcome.from_json(found)
    found = rec.json(progress.PROGRESS_FILE, dict, None, progress.FIELDS)
    info.progress = None if found is None else Progress.from_json(found)
    info.excluded = rec.strings(exclusions.EXCLUDED_FILE)
    snapshot = rec.json(SNAPSHOT_FILE, dict, {}, snapshots.FIELDS)
    info.snapshot = str(snapshot["id"]) if snapshot.get("id") is not None else None
    info.cancel_requested = outcome.CANCEL_FILE in present
    info.submitted = submitted_time(run_dir, record, info.intent, info.attempts)
    if preflight.HEALTH_DIR in present:
        latest = f"{preflight.HEALTH_DIR}/{preflight.LATEST_FILE}"
        found = rec.json(latest, dict, None, preflight.LATEST_FIELDS)
        info.preflight = None if not found else LatestVerdicts.from_json(found)
        summary = f"{watchdog.HEALTH_DIR}/{watchdog.SUMMARY_FILE}"
        found = rec.json(summary, dict, None, watchdog.SUMMARY_FIELDS)
        info.watchdog = None if not found else Summary.from_json(found)
    if staging.STAGING_DIR in present:
        info.staging = latest_staging(run_dir, info.attempts, rec.problems)
    if group_state.GROUPS_DIR in present:
        info.groups = group_state.read_state(run_dir)
    if STANDBYS_FILE in present:
        info.standbys = read_standbys(run_dir)
    if AFTER_FILE in present:
        info.after = read_after(run_dir)
    found = rec.json(BALANCE_FILE, dict, None, balance.FIELDS)  # no open when absent
    info.balance = None if not found else BalanceRecord.from_json(found)
    if COMPONENTS_DIR in present:
        info.services, problems = read_services(run_dir)
        rec.problems += problems
    if CONFIG_FILE not in present and (present or run_dir.is_dir()):
        # A directory that does not exist is no damage: a sweep member that has not started
        # has none yet (its job ids come from the sweep's array records).
        rec.problems.append(records.Problem(CONFIG_FILE, "missing"))
    elif with_checkpoints:
        _read_checkpoints(info, present, rec)
    info.problems = rec.lines()
    return info


def _read_checkpoints(info: RunInfo, present: AbstractSet[str], rec: records.Reader) -> None:
    # A run that never started has no checkpoint: skip the config read for pending runs
    # (most of a large sweep's members while it is queued).
    started = present & {
        ATTEMPTS_FILE,
        progress.PROGRESS_FILE,
        progress.RESULT_FILE,
        outcome.OUTCOME_FILE,
    }
    if CONFIG_FILE not in present or not (started or CHECKPOINTS_DIR in present):
        return
    run_dir = info.path
    try:
        source = checkpoint_source(run_dir)
    except records.Unreadable as exc:
        rec.problems.append(exc.problem)
        return
    info.checkpoint_root, info.trainer = source.root, source.kind
    root = source.root
    if root.parent != run_dir or root.name in present:
        latest = latest_checkpoint(run_dir, source)
        if latest is not None:
            info.latest_step, info.latest_checkpoint = latest.step, latest.path


def latest_staging(
    run_dir: Path,
    attempts: Sequence[AttemptRecord],
    problems: list[records.Problem] | None = None,
) -> dict[str, NodeStaging]:
    """The staging records of the newest attempt that staged (host -> record)."""
    every = staging.read_all(run_dir, problems)
    for rec in reversed(attempts):
        if rec.key in every:
            return every[rec.key]
    return every[max(every)] if every else {}


def run_id(run_dir: Path) -> str:
    """A run's id as the commands print and accept it: its directory's name, or
    ``SWEEP/<i>`` for a sweep member."""
    if run_dir.parent.name == MEMBERS_DIR and run_dir.name.isdigit():
        found = member_of(run_dir)
        if found is not None:
            return f"{found[0].name}/{found[1]}"
    return run_dir.name


def submitted_time(
    run_dir: Path,
    record: Submission,
    intent: Intent | None,
    attempts: Sequence[AttemptRecord],
) -> float | None:
    """When the run was last submitted (a local run: when it started): the order
    ``status`` lists runs in."""
    for value in (record.submitted, intent.created if intent is not None else None):
        if value is not None:
            return float(value)
    if attempts and attempts[0].start:
        return float(attempts[0].start)
    try:
        return os.stat(run_dir / CONFIG_FILE).st_mtime
    except OSError:
        return None


class RunReader:
    """``read_run`` with the status cache of each parent directory (run root, sweep)."""

    def __init__(self, clock: Any = None) -> None:
        import time

        self.now = (clock or time.time)()
        # Keyed by the parent's path as a string: hashing a Path costs more than the lookup.
        self.caches: dict[str, StatusCache] = {}

    def cache(self, parent: Path) -> StatusCache:
        key = str(parent)
        cache = self.caches.get(key)
        if cache is None:
            cache = self.caches[key] = StatusCache(parent)
        return cache

    def final(self, run_dir: Path, mtime_ns: int | None) -> tuple[Final, int] | None:
        """The run's final state and its directory's mtime, when the cache knows the run
        ended and its directory has not changed since."""
        if mtime_ns is None:
            try:
                mtime_ns = os.stat(run_dir).st_mtime_ns
            except OSError:
                return None
        hit = self.cache(run_dir.parent).get_final(run_dir.name, mtime_ns)
        return (hit, mtime_ns) if hit is not None else None

    def remember_final(self, info: RunInfo, state: str) -> None:
        """``info``'s run ended in ``state``: cache it while its directory stays as read
        (never from records that could not be read: that is no final state)."""
        if info.mtime_ns is not None and not info.problems:
            final = Final(state, info.submitted)
            self.cache(info.path.parent).put_final(info.path.name, info.mtime_ns, self.now, final)

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
            info = RunInfo(path=run_dir, run_id=run_id(run_dir), job_ids=hit.job_ids)
            info.intent, info.submitted, info.mtime_ns = hit.intent, hit.submitted, mtime_ns
            return info
        try:
            listing = set(os.listdir(run_dir))
        except OSError:
            listing = set()
        info = read_run(run_dir, listing=listing)
        info.mtime_ns = mtime_ns
        if info.problems:  # its damaged records are read again, and said, every poll
            cache.forget(run_dir.name)
            return info
        if info.intent is not None and info.intent.target == "kubernetes":
            # Its state comes from the intent's target and manifest, which a queued entry
            # does not keep; and reading it asks no scheduler, so there is nothing to save.
            return info
        if AFTER_FILE in listing:
            # A dependent (submit --after): what it waits for is said from its after.json
            # on every poll, which a queued entry does not keep. Dependents are few.
            return info
        queued = Queued(info.job_ids, info.intent, info.submitted)
        cache.put(run_dir.name, mtime_ns, listing, self.now, queued)
        return info

    def save(self) -> None:
        for cache in self.caches.values():
            cache.save()


@dataclass
class RootListing:
    """What one look at the run root found: runs and sweeps (in mtime order) whose state a
    poll has to work out, and runs whose final state the status cache holds (name ->
    (mtime_ns, Final)), which need no further look, not even a ``Path``."""

    entries: list[tuple[str, Path, int]] = field(default_factory=list)  # (kind, path, mtime)
    finals: dict[str, tuple[int, Final]] = field(default_factory=dict)
    pipelines: list[Path] = field(default_factory=list)  # directories of pipeline.json


def scan_root(root: Path, cache: StatusCache) -> RootListing:
    """One ``scandir`` of the run root and one stat per entry. Entries the cache knows are
    runs without a further look; the others are listed once to tell a run (config.yaml)
    from a sweep (members.json)."""
    found = RootListing()
    try:
        scan = os.scandir(root)
    except OSError:
        return found
    entries = []
    with scan:
        for entry in scan:
            name = entry.name
            if name.startswith("."):
                continue
            try:
                mtime_ns = entry.stat().st_mtime_ns
            except OSError:
                continue
            final = cache.get_final(name, mtime_ns)
            if final is not None:
                found.finals[name] = (mtime_ns, final)
                continue
            if cache.known(name):
                entries.append((mtime_ns, name, "run"))
                continue
            try:
                listing = set(os.listdir(entry.path))
            except OSError:  # not a directory, or gone meanwhile
                continue
            run = CONFIG_FILE in listing or SCRIPT_FILE in listing  # as is_run_dir
            # A sweep that lost its members.json still has its arrays: status says so.
            sweep = MEMBERS_FILE in listing or ARRAYS_DIR in listing
            kind = "run" if run else "sweep" if sweep else ""
            if kind:
                entries.append((mtime_ns, name, kind))
            elif PIPELINE_FILE in listing:  # its stages are runs of their own, listed too
                found.pipelines.append(root / name)
    entries.sort()
    found.entries = [(kind, root / name, mtime_ns) for mtime_ns, name, kind in entries]
    cache.keep_only({*found.finals, *(name for _, name, _ in entries)})
    return found


def list_targets(
    root: Path | None = None, reader: RunReader | None = None
) -> list[tuple[str, Path, int]]:
    """Runs and sweeps under the run root, oldest first: ("run" | "sweep", path, mtime_ns).
    ``reader`` shares its already loaded cache. The mtime is returned so that the reader
    need not stat again."""
    root = root or default_run_root()
    cache = reader.cache(root) if reader is not None else StatusCache(root)
    found = scan_root(root, cache)
    runs = [("run", root / name, m) for name, (m, _) in found.finals.items()]
    return sorted([*found.entries, *runs], key=lambda e: (e[2], e[1].name))


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
    info.submitted = jobs.time
    info.cancel_requested = is_cancelled(found[0], found[1], info.job_id)
    if jobs.state == "failed":
        info.intent = Intent(state="failed", error=jobs.error)
    return info
