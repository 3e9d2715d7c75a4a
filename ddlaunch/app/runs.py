"""Reading runs back from their run directories (login node, torch-free; used by status,
logs, cancel, resume, report, and doctor's "my latest run"); a run named on the command line
is found by ``app.run_refs``.

The run directory is the source of truth: job ids, attempts, failures, results and
checkpoints are all read from files there. Slurm is asked only for the live state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from ddlaunch.store.attempts import ATTEMPTS_FILE, AttemptRecord, key_of
from ddlaunch.store.balance import BALANCE_FILE, BalanceRecord
from ddlaunch.store.chain import AFTER_FILE, PredecessorRecord, read_after
from ddlaunch.store.components import COMPONENTS_DIR, ServiceState
from ddlaunch.store.components import read_all as read_services
from ddlaunch.store.failures import FAILURES_DIR, Failure, read_failures, unusable_failures
from ddlaunch.store.layout import ARRAYS_DIR
from ddlaunch.store.members import member_of
from ddlaunch.store.outcome import Outcome
from ddlaunch.store.pipelines import PIPELINE_FILE
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
    member_jobs,
)
from ddlaunch.store.watchdog import Summary, Verdict


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
    verdict: Verdict | None = None  # the watchdog's verdict on the latest attempt while open
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
        info.verdict = _open_verdict(info.attempts, rec)
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


def _open_verdict(found: Sequence[AttemptRecord], rec: records.Reader) -> Verdict | None:
    """The watchdog's verdict on the latest attempt, read while the attempt is open only (a
    closed attempt's record holds its blame)."""
    a = found[-1] if found else None
    if a is None or not a.is_open:
        return None
    # Keyed as the batch host keys it (``AttemptId.key``).
    key = key_of(a.job_id or "local", a.restart_count or 0, a.relaunch or 0)
    name = f"{watchdog.HEALTH_DIR}/{watchdog.verdict_name(key)}"
    verdict = rec.json(name, dict, None, watchdog.VERDICT_FIELDS)
    return None if not verdict else Verdict.from_json(verdict)


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


def submitted_at(run_dir: Path) -> float | None:
    """``submitted_time`` reading only what it needs: ``submission.json`` alone (one small
    file) for a run whose submission was recorded; the intent, the attempts and the config's
    mtime only for one without (a submit cut short, a local run)."""
    record = submission.read_submission(run_dir)
    if record.submitted is not None:
        return float(record.submitted)
    intent = submission.read_intent(run_dir)
    return submitted_time(run_dir, record, intent, attempts.load(run_dir))


def list_runs(root: Path | None = None) -> list[Path]:
    """The runs directly under the run root in the order ``status`` lists them: by when each
    was last submitted (``submitted_at``; a resume counts), so ``list_runs()[-1]`` is my
    latest run. Never by the directory's mtime: anything written into an old run (a
    ``report``, a log) would make it the latest. A run without a time comes first; equal
    times go by id. Per run: the stat of ``is_run_dir`` and one small file read (more only
    for a run without a recorded submission time)."""
    root = root or default_run_root()
    if not root.is_dir():
        return []
    keyed = []
    for path in root.iterdir():
        if is_run_dir(path):
            when = submitted_at(path)
            keyed.append((when is not None, when or 0.0, path.name, path))
    return [path for *_, path in sorted(keyed)]


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
