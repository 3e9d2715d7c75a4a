"""``status``'s polls: which runs to show (named ones, or everything under the run root, the
finished ones beyond the latest few only counted), ONE ``squeue`` call for the jobs of those
that have not ended, at most one ``sacct`` for jobs the controller forgot, and the pure join
of ``app.status``. Runs whose final state an earlier poll cached (``store.status_cache``)
cost no Slurm call and no directory read unless they are shown. The runner is injected, so
tests count the calls.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.app.pipeline_status import find_pipeline, group_pipelines, stage_targets
from ddlaunch.app.run_refs import ambiguous_prefix, find_run, member_path
from ddlaunch.app.runs import RunInfo, RunReader, complete_member_info, list_targets, scan_root
from ddlaunch.app.status import (
    ACTIVE_STATES,
    NoScheduler,
    RunStatus,
    needs_accounting,
    run_status,
    settled,
)
from ddlaunch.app.sweep_rows import group_sweeps
from ddlaunch.errors import UserError
from ddlaunch.runner import NOT_FOUND
from ddlaunch.slurm import queue
from ddlaunch.slurm.client import JobRows, SlurmClient, SlurmError, SlurmUnreachable
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store import sweeps
from ddlaunch.store.members import member_of
from ddlaunch.store.rundir import config_path, default_run_root, is_run_dir
from ddlaunch.store.status_cache import Final


@dataclass(frozen=True)
class Target:
    """What ``status`` shows: a run, or one member of a sweep (``sweep`` is its id)."""

    path: Path
    sweep: str | None = None
    label: str | None = None
    mtime_ns: int | None = None  # the run directory's, when listing it stat'ed it already
    final: Final | None = None  # its final state, when an earlier poll cached it


def poll(
    targets: Sequence[Target],
    client: JobRows,
    *,
    form: str = "text",
    read: Any = None,
    now: float | None = None,
    reader: Any = None,
) -> list[RunStatus]:
    """Read every run directory, make ONE squeue call for the jobs of the runs that have not
    ended (and at most one sacct for jobs the controller forgot), join. Runs whose final
    state an earlier poll cached (``Target.final``) cost no Slurm call. ``read`` replaces
    the cached reader (``runs.RunReader``; pass the one ``resolve`` used to share its
    loaded cache)."""
    reader = reader or RunReader()
    infos = []
    for t in targets:
        info = read(t.path) if read is not None else reader.read(t.path, t.mtime_ns)
        info.label = t.label
        if t.sweep:
            info.run_id = f"{t.sweep}/{t.path.name}"
            if not info.job_ids:  # a member that has not started has no run directory yet
                complete_member_info(info)
        infos.append(info)
    live = [i for i, t in zip(infos, targets, strict=True) if t.final is None]
    job_ids = [i.job_id for i in live if i.job_id]
    chained = [i for i in live if i.after]
    if chained:  # the predecessors' jobs, in the same one call (status of a dependent)
        from ddlaunch.app.chain_status import waiting_jobs

        job_ids = sorted({*job_ids, *waiting_jobs(chained)})
    queue, accounted, unreachable = _ask(client, live, job_ids, form)
    now = time.time() if now is None else now
    rows = []
    for info, target in zip(infos, targets, strict=True):
        if target.final is not None:
            rows.append(run_status(info, None, None, now, final=target.final.state))
            continue
        job = info.job_id or ""
        row = run_status(info, queue.get(job) or accounted.get(job), None, now)
        if info.after and row.state == "PENDING" and row.reason:
            from ddlaunch.app.chain_status import waiting_note

            row.reason = waiting_note(info, row.reason, queue, reader) or row.reason
        if unreachable and job:
            row.reason = unreachable  # not a final state: nothing to cache
        elif read is None and settled(info, row):
            reader.remember_final(info, row.state)
        rows.append(row)
    reader.save()
    return rows


def _ask(
    client: JobRows, live: Sequence[RunInfo], job_ids: Sequence[str], form: str
) -> tuple[dict[str, QueueRow], dict[str, QueueRow], str]:
    """(squeue's rows, sacct's rows, why Slurm could not be asked or ""): the one squeue
    call, and the one sacct for the jobs the controller forgot."""
    try:
        queue = client.status_rows(job_ids, form) if job_ids else {}
        gone = [
            i.job_id for i in live if i.job_id and i.job_id not in queue and needs_accounting(i)
        ]
        return queue, client.accounting_rows(gone) if gone else {}, ""
    except SlurmUnreachable as exc:  # the run directories still say what they know
        return {}, {}, f"Slurm unreachable ({exc.detail})"
    except SlurmError as exc:
        if exc.result.returncode != NOT_FOUND:
            raise
        # No Slurm commands on this host (a run directory copied off the cluster, say): the
        # run directories say what they know, as while the controller is down.
        return {}, {}, f"no Slurm here ({exc.detail})"


def resolve(
    refs: Iterable[str], root: Path | None = None, reader: Any = None
) -> tuple[list[Target], list[str]]:
    """RUN or SWEEP references -> targets. Without refs: every run and sweep under the run
    root (sweeps are summarised by the caller). Returns (targets, sweep ids named).
    ``reader`` (a ``runs.RunReader``) lends its status cache to the listing."""
    root = root or default_run_root()
    targets: list[Target] = []
    sweeps: list[str] = []
    refs = list(refs)
    if not refs:
        for kind, path, mtime_ns in list_targets(root, reader):
            if kind == "run":
                targets.append(Target(path, mtime_ns=mtime_ns))
            else:
                targets += _members(path)
        return targets, sweeps
    for ref in refs:
        if is_run_dir(Path(ref).expanduser()) or is_run_dir(root / ref):
            targets.append(_as_target(find_run(ref, root)))
            continue
        pipeline = find_pipeline(ref, root, prefix=False)
        if pipeline is not None:
            targets += [_as_target(p) for p in stage_targets(pipeline)]
            continue
        sweep = _find_sweep(ref, root)
        if sweep is not None:
            sweeps.append(sweep.name)
            targets += _members(sweep)
            continue
        member = member_path(ref, root)
        if member is None and member_of(Path(ref).expanduser().absolute()) is not None:
            member = Path(ref).expanduser().absolute()  # a member's directory, not yet made
        target = _as_target(member) if member is not None else None
        if target is None or target.label is None:  # not a member: find_run says why
            try:
                target = _as_target(find_run(ref, root))
            except UserError:
                pipeline = find_pipeline(ref, root, prefix=True)  # a pipeline's id prefix
                if pipeline is None:
                    raise
                targets += [_as_target(p) for p in stage_targets(pipeline)]
                continue
        targets.append(target)
    return targets, sweeps


def _as_target(path: Path) -> Target:
    """A run directory, or a sweep member's (``<sweep>/members/<i>``, started or not), as
    ``status`` shows it: a member keeps its sweep's id and its overrides."""
    found = member_of(path)
    if found is None:
        return Target(path)
    labels = {p: label for label, p in _member_dirs(found[0])}
    return Target(path, found[0].name, labels.get(path))


def _find_sweep(ref: str, root: Path) -> Path | None:
    """The sweep ``ref`` names: its directory, its id, or a prefix that begins no other id
    under the root, a run's included (``UserError`` when a sweep's prefix begins others too:
    guessing would cancel what the user did not mean). None: not a sweep (a prefix of runs
    only is ``find_run``'s)."""
    for candidate in (Path(ref).expanduser(), root / ref):
        if candidate.is_dir() and sweeps.is_sweep_dir(candidate):
            return candidate.absolute()
    if is_run_dir(Path(ref).expanduser()) or is_run_dir(root / ref) or "/" in ref:
        return None
    begun = sorted(p for p in root.glob(f"{ref}*") if p.is_dir())
    found = [p for p in begun if sweeps.is_sweep_dir(p)]
    runs = [p for p in begun if is_run_dir(p) and p not in found]
    if not found:
        return None
    if len(found) == 1 and not runs:
        return found[0]
    raise UserError(ambiguous_prefix(ref, [p.name for p in found], [p.name for p in runs]))


def _member_dirs(path: Path) -> list[tuple[str, Path]]:
    try:
        return sweeps.member_run_dirs(path)
    except Exception:  # a broken sweep must not hide the other runs
        return []


def unreadable_sweep(path: Path) -> RunStatus:
    """The row of a sweep whose members cannot be known: its id and why."""
    try:
        sweeps.member_run_dirs(path)
        why = f"unreadable {sweeps.MEMBERS_FILE}: no members"
    except Exception as exc:  # whatever the damage, the row says it
        why = str(exc).split(": ", 1)[-1] if "unreadable" in str(exc) else str(exc)
    row = RunStatus(path.name, str(path), None, "UNKNOWN", "", "", None, None, None, None, None)
    row.problems = [why]
    return row


def _members(path: Path) -> list[Target]:
    return [Target(run_dir, path.name, label) for label, run_dir in _member_dirs(path)]


# The default view: every run that has not ended, and this many of the latest that did.
RECENT_FINISHED = 20


@dataclass
class StatusView:
    rows: list[RunStatus]
    root: Path
    hidden: int = 0  # finished runs (and sweeps) left out of the default view
    names: list[str] = field(default_factory=list)  # every run and sweep id the poll saw


def view(
    refs: tuple[str, ...],
    runner: Any = None,
    *,
    overview: bool | None = None,
    show_all: bool = True,
    since: float | None = None,
    now: float | None = None,
    target: str = "slurm",
    root: Path | None = None,
) -> StatusView:
    """One poll of ``status``: the runs and sweeps named by ``refs`` (all when empty), with
    ONE squeue call for those that have not ended. Without refs and ``show_all``, finished
    runs are shown only if they are among the ``RECENT_FINISHED`` latest (or, with
    ``since``, submitted in the last ``since`` seconds); the others are counted. The final
    state of a run that ended is cached once (``store.status_cache``): a later poll neither
    asks Slurm about it nor reads its directory unless it is shown, so it costs what the
    active runs cost. ``runner`` is injectable (tests count the Slurm calls it receives).
    ``target`` kubernetes: no scheduler is asked, the run directories alone say it.
    ``root``: the run root to read (default: ``$DDLAUNCH_RUN_ROOT`` or the built-in one)."""
    now = time.time() if now is None else now
    root = root or default_run_root()
    reader = RunReader(lambda: now)  # one cache load for both the listing and the reads
    grouped = not refs if overview is None else overview
    # Runs under the root the cache knows ended: their names only (no Path, no read) until
    # one of them is shown: a poll over 10,000 finished runs is one stat each.
    finals: dict[str, tuple[int, Final]] = {}
    broken: list[RunStatus] = []
    if refs:
        targets, _ = resolve(refs, root=root, reader=reader)
    else:
        listing = scan_root(root, reader.cache(root))
        finals = listing.finals
        targets = []
        for kind, path, mtime_ns in listing.entries:
            found = [Target(path, mtime_ns=mtime_ns)] if kind == "run" else _members(path)
            targets += found
            if not found:  # a sweep whose members.json is damaged: a row says so
                broken.append(unreadable_sweep(path))
    units: dict[str, list[Target]] = {}
    for t in targets:  # a sweep is one row of the overview: kept or hidden as a whole
        hit = reader.final(t.path, t.mtime_ns) if refs or t.sweep else None
        t = Target(t.path, t.sweep, t.label, hit[1], hit[0]) if hit else t
        units.setdefault(t.sweep if grouped and t.sweep else str(t.path), []).append(t)
    cached = {k: u for k, u in units.items() if all(t.final for t in u)}
    live = [t for k, unit in units.items() if k not in cached for t in unit]
    client = NoScheduler() if target == "kubernetes" else SlurmClient(runner)
    form = queue.choose_form(_slurm_version(live), _forced_form())
    rows = dict(zip(live, poll(live, client, form=form, reader=reader, now=now), strict=True))
    hidden = 0
    shown_finals = set(finals)
    if not refs and not show_all:
        ended = {
            k: min(_times(rows[t] for t in u))
            for k, u in units.items()
            if k not in cached and all_ended([rows[t] for t in u])
        }
        ended |= {k: min(_times(t.final for t in u)) for k, u in cached.items()}
        ended |= {name: float(f.submitted or 0.0) for name, (_, f) in finals.items()}
        keep = _latest(ended, since, now)
        hidden = len(ended) - len(keep)
        units = {k: u for k, u in units.items() if k not in ended or k in keep}
        shown_finals &= keep
    for name in shown_finals:
        mtime_ns, final = finals[name]
        units[name] = [Target(root / name, mtime_ns=mtime_ns, final=final)]
    shown = [t for unit in units.values() for t in unit]
    ended_now = [t for t in shown if t not in rows]  # read now: no Slurm call for them
    rows.update(
        zip(ended_now, poll(ended_now, client, form=form, reader=reader, now=now), strict=True)
    )
    out = [rows[t] for t in shown] + broken
    names = sorted({*(t.sweep or t.path.name for t in targets), *finals})
    if not grouped:
        return StatusView(by_order(out, refs), root, hidden, names)
    pipelines = listing.pipelines if not refs else []
    names = sorted({*names, *(p.name for p in pipelines)})
    return StatusView(group_pipelines(group_sweeps(out), pipelines), root, hidden, names)


def by_order(rows: list[RunStatus], refs: tuple[str, ...]) -> list[RunStatus]:
    """Named runs in the order named; everything under the root by submission."""
    return rows if refs else sorted(rows, key=lambda r: (r.submitted is not None, r.submitted or 0))


def _times(items: Iterable[Any]) -> list[float]:
    return [float(i.submitted or 0.0) for i in items] or [0.0]


def all_ended(rows: Sequence[RunStatus]) -> bool:
    """Every row reached a final state (what ``status --watch RUN`` waits for)."""
    return all(r.state not in ACTIVE_STATES and r.state != "UNKNOWN" for r in rows)


def _latest(ended: dict[str, float], since: float | None, now: float) -> set[str]:
    """Which of the runs (or sweeps) that ended the default view keeps."""
    if since is not None:
        return {key for key, when in ended.items() if when >= now - since}
    return set(sorted(ended, key=ended.__getitem__)[-RECENT_FINISHED:])


def collect(
    refs: tuple[str, ...],
    runner: Any = None,
    *,
    overview: bool | None = None,
    target: str = "slurm",
) -> list[RunStatus]:
    """Every run and sweep ``view`` finds (nothing hidden)."""
    return view(refs, runner, overview=overview, target=target).rows


def _forced_form() -> str | None:
    return os.environ.get("DDLAUNCH_SQUEUE_FORM") or None


def _slurm_version(targets: Sequence[Any]) -> str | None:
    """The cluster's release from the first run's config (cluster.slurm_version): no extra
    call to Slurm just to learn its version."""
    for target in targets[:1]:
        try:
            text = config_path(target.path).read_text()
        except (OSError, ValueError):  # missing, or not UTF-8: read_run says which
            return None
        match = re.search(r"^  slurm_version: '?([0-9.]+)'?$", text, re.M)
        return match.group(1) if match else None
    return None
