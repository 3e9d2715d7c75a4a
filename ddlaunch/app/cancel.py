"""``cancel``: stop runs and sweeps, and say truthfully what that did.

Every reference is resolved first, so that one unknown id cancels nothing. A run that has
ended is left alone ("already finished (COMPLETED)", "already cancelled"): nothing is written.
For the others ``cancel.json`` is recorded before the one scancel (the job's own requeue logic
asks for it); a member of a sweep that has not started gets no run directory, its cancel goes
into the sweep's ``cancelled.json``. Then ``cancel`` waits (bounded) for the jobs to leave the
queue: the ranks save on the SIGTERM and rank 0 concludes the attempt (``conclude``). A job
that was killed before anyone concluded it (cancelled before its first step, or while its
training ended) is concluded here, once it is gone: its open attempt is closed and its outcome
written, so the run's final state is recorded and never changes afterwards. A run whose latest
attempt had already ended (a node failure or a crash, with its requeue pending) keeps that
attempt's ending: the cancel is recorded on the run and, on the attempt, as what happened to
the pending requeue (``then``), never as the attempt's cause.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch.app.run_refs import find_member
from ddlaunch.app.runs import read_run
from ddlaunch.app.status import ACTIVE_STATES, RunStatus, fold_state
from ddlaunch.app.status_poll import Target, poll, resolve
from ddlaunch.conclude import conclude, saved_phrase
from ddlaunch.config.trainers import is_byo
from ddlaunch.policy import requeue as policy
from ddlaunch.policy.requeue import NO_RETRY, Ending
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, outcome
from ddlaunch.store.members import member_of
from ddlaunch.store.records import Unreadable
from ddlaunch.store.rundir import checkpoint_source, committed_step, default_run_root, is_run_dir
from ddlaunch.store.sweep_cancels import record_cancelled
from ddlaunch.wording import counted, plural

POLL_S = 0.5


@dataclass
class Plan:
    """What one ``cancel`` will do, decided before anything is written."""

    rows: list[tuple[str, Target, RunStatus]] = field(default_factory=list)  # (ref, ...)
    sweeps: dict[str, list[int]] = field(default_factory=dict)  # ref -> members cancelled

    def to_cancel(self) -> list[tuple[str, Target, RunStatus]]:
        return [(ref, t, r) for ref, t, r in self.rows if _cancellable(r)]


@dataclass(frozen=True)
class Waiting:
    """The jobs ``cancel`` waits for, told before the wait: a job that started stops after
    its ranks save; one that never started (still queued) only leaves the queue."""

    started: tuple[str, ...]
    queued: tuple[str, ...]
    # Started jobs whose trainer does not save on the cancel's SIGTERM (Lightning saves on
    # USR1, DeepSpeed on no signal): their last periodic checkpoint is what is kept.
    unsaved: tuple[str, ...] = ()

    @property
    def jobs(self) -> tuple[str, ...]:
        return self.started + self.queued


def saves_on_cancel(run_dir: Path) -> bool:
    """Whether the run's ranks save when the cancel's SIGTERM reaches them: Session code and
    trainers whose stop signal is TERM (HF's JIT checkpoint, Megatron's handler) do."""
    try:
        source = checkpoint_source(run_dir)
    except (OSError, Unreadable, ValueError):
        return True  # unknown: say what Session code does
    return not is_byo(source.kind) or source.layout.signal == "TERM"


def _cancellable(row: RunStatus) -> bool:
    return row.state in ACTIVE_STATES and bool(row.job_id)


def _targets(ref: str, root: Path) -> tuple[list[Target], bool]:
    """``ref`` -> its targets (a sweep: every member) and whether it names a sweep, resolved
    as ``status`` resolves it (``status_poll.resolve``: a sweep's id, directory or unique id
    prefix is the whole sweep), so that ``cancel X`` stops what ``status X`` shows."""
    member = find_member(ref, root)  # one member that has not started (no run directory)
    if member is not None:
        return resolve([str(member)], root)[0], False
    targets, sweeps_named = resolve([ref], root)
    return targets, bool(sweeps_named)


def plan_cancel(refs: Sequence[str], client: SlurmClient, root: Path | None = None) -> Plan:
    """Resolve every reference (one unknown: UserError, nothing done) and read every run's
    state with ONE squeue call."""
    root = root or default_run_root()
    named: list[tuple[str, Target, bool]] = []
    for ref in refs:
        targets, is_sweep = _targets(ref, root)
        named += [(ref, t, is_sweep) for t in targets]
    rows = poll([t for _, t, _ in named], client)
    plan = Plan()
    for (ref, target, is_sweep), row in zip(named, rows, strict=True):
        plan.rows.append((ref, target, row))
        if is_sweep:
            plan.sweeps.setdefault(ref, [])
    return plan


def _record(plan: Plan) -> list[str]:
    """Write the cancel records (before scancel); returns the job ids to cancel."""
    jobs: list[str] = []
    unstarted: dict[Path, dict[int, str]] = {}
    for ref, target, row in plan.to_cancel():
        assert row.job_id
        if is_run_dir(target.path):
            outcome.write_cancel(target.path, [row.job_id])
        else:  # a member that has not started: its directory is not created for this
            found = member_of(target.path)
            assert found is not None
            unstarted.setdefault(found[0], {})[found[1]] = row.job_id
        if ref in plan.sweeps:
            plan.sweeps[ref].append(int(target.path.name))
        jobs.append(row.job_id)
    for sweep_dir, members in unstarted.items():
        record_cancelled(sweep_dir, members)
    return jobs


def _scancel_ids(plan: Plan) -> list[str]:
    """A sweep's members go by their arrays (one id for all of an array's tasks; its ended
    tasks are not touched), a run or a single member by its own id."""
    ids = set()
    for ref, _, row in plan.to_cancel():
        assert row.job_id
        ids.add(row.job_id.split("_")[0] if ref in plan.sweeps else row.job_id)
    return sorted(ids)


def _wait_until_gone(client: SlurmClient, jobs: list[str], wait_s: float) -> set[str]:
    """Poll (one squeue per poll) until none of ``jobs`` runs, waits or completes any more,
    or ``wait_s`` passed; returns the ones still there."""
    deadline = time.monotonic() + wait_s
    left = set(jobs)
    while left:
        rows = client.status_rows(sorted(left))
        left = {j for j in left if j in rows and fold_state(rows[j].state) in ACTIVE_STATES}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return left


def _quiet(text: str) -> None:
    """``cancel`` prints its own lines."""


def close_cancelled(run_dir: Path) -> str:
    """The run's job is gone: conclude it as cancelled if nobody did (the job was killed
    before rank 0 or the end hook could); returns how it ended, as outcome.json says."""
    recorded = outcome.read_outcome(run_dir)
    if recorded is None:
        info = read_run(run_dir, with_checkpoints=False)
        try:
            committed = committed_step(run_dir)
        except Unreadable:  # its config is damaged (status says so): no step known
            committed = None
        records = attempts.load(run_dir)
        pending = bool(records) and (not records[-1].is_open or records[-1].cut_off)
        if pending:  # the attempt ended before the cancel: its requeue was waiting
            reason = saved_phrase("cancelled while its requeue was pending", None, committed)
        elif info.attempts:
            reason = saved_phrase("cancelled", None, committed)
        else:
            reason = "cancelled before it started"
        ending = Ending(policy.CAUSE_CANCELLED, committed, final=reason)
        conclude(run_dir, ending, NO_RETRY, None, say=_quiet)
        if records and not records[-1].is_open:
            # Closed before: its ending stays; what the cancel did goes beside it.
            attempts.update_last(run_dir, then=reason)
        recorded = outcome.read_outcome(run_dir)
    if recorded is None:
        return "cancelled"
    return recorded.reason or recorded.state or "cancelled"


def cancel(
    refs: Sequence[str],
    client: SlurmClient | None = None,
    *,
    wait_s: float = 120.0,
    waiting: Callable[[Waiting], None] | None = None,
) -> list[str]:
    """Cancel what ``refs`` name; returns the lines to print. ``waiting`` is told the jobs it
    waits for, before the wait. An interrupt during the wait carries a note that the jobs
    were cancelled already (the scancel ran; only the wait was cut short)."""
    client = client or SlurmClient()
    plan = plan_cancel(refs, client)
    jobs = _record(plan)
    if jobs:
        client.cancel(_scancel_ids(plan))
    try:  # from here on an interrupt cuts the wait short, not the cancel
        if jobs and waiting is not None and wait_s > 0:
            queued = {r.job_id for _, _, r in plan.to_cancel() if r.state == "PENDING"}
            unsaved = {
                r.job_id
                for _, t, r in plan.to_cancel()
                if r.job_id not in queued and is_run_dir(t.path) and not saves_on_cancel(t.path)
            }
            waiting(
                Waiting(
                    tuple(j for j in jobs if j not in queued),
                    tuple(j for j in jobs if j in queued),
                    tuple(j for j in jobs if j in unsaved),
                )
            )
        left = _wait_until_gone(client, jobs, wait_s) if jobs and wait_s > 0 else set(jobs)
    except KeyboardInterrupt as exc:
        if jobs:
            exc.add_note(_not_waiting(jobs))
        raise
    ended = {}
    for _, target, row in plan.to_cancel():
        if row.job_id not in left and is_run_dir(target.path):
            ended[target.path] = close_cancelled(target.path)
    return _lines(plan, left, ended)


def _not_waiting(jobs: Sequence[str]) -> str:
    if len(jobs) == 1:
        return f"job {jobs[0]} was cancelled; not waiting for it to stop"
    return f"{counted(len(jobs), 'job')} were cancelled; not waiting for them to stop"


def _lines(plan: Plan, left: set[str], ended: dict[Path, str]) -> list[str]:
    lines: list[str] = []
    for ref, target, row in plan.rows:
        if ref not in plan.sweeps:
            lines.append(f"{row.run_id}: {_one(target, row, left, ended)}")
    for ref, members in plan.sweeps.items():
        rows = [r for name, _, r in plan.rows if name == ref]
        lines.append(_sweep_line(rows, members, left))
    return lines


def _one(target: Target, row: RunStatus, left: set[str], ended: dict[Path, str]) -> str:
    if not _cancellable(row):
        return _not_cancelled(row)
    if row.job_id in left:
        return (
            f"cancelled job {row.job_id}, which is still stopping (ddlaunch status "
            f"{row.run_id} says how it ended)"
        )
    if target.path not in ended:
        return f"cancelled job {row.job_id} before it started"
    return f"cancelled job {row.job_id}: {ended[target.path]}"


def _not_cancelled(row: RunStatus) -> str:
    if row.state == "CANCELLED":
        return "already cancelled; nothing to do"
    if row.state not in ACTIVE_STATES and row.state != "UNKNOWN":
        return f"already finished ({row.state}); nothing to cancel"
    if not row.job_id:
        return "no Slurm job to cancel (a local run stops with Ctrl-C where it runs)"
    return f"job {row.job_id} is {row.state}; nothing to cancel"


def _sweep_line(rows: Sequence[RunStatus], members: list[int], left: set[str]) -> str:
    sweep_id = rows[0].run_id.split("/")[0] if rows else "?"
    if not members:
        return f"{sweep_id}: every member had ended already; nothing to cancel"
    cancelled = [r for r in rows if int(Path(r.path).name) in members]
    arrays = sorted({(r.job_id or "").split("_")[0] for r in cancelled})
    counts = Counter(r.state.lower() for r in cancelled)
    what = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    line = f"{sweep_id}: cancelled {counted(len(members), 'member')} ({what}; "
    line += f"{plural(len(arrays), 'array')} {', '.join(arrays)})"
    done = len(rows) - len(members)
    if done:
        line += f"; {done} had ended already"
    stopping = sum(1 for r in cancelled if r.job_id in left)
    if stopping:
        line += f"; {stopping} still stopping (ddlaunch status {sweep_id})"
    return line
