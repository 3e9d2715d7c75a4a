"""``ddlaunch sweep status``: one row per member, from its run directory (or, for a member
that has not started, the sweep's records) plus ONE squeue call for every task of every
array of the sweep (torch-free)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddlaunch.app.runs import RunInfo, read_run
from ddlaunch.app.status import run_status
from ddlaunch.slurm.client import SlurmClient, SlurmUnreachable
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store.rundir import default_run_root
from ddlaunch.store.submission import Intent
from ddlaunch.store.sweep_cancels import cancelled_members
from ddlaunch.store.sweeps import (
    MEMBERS_DIR,
    find_sweep,
    member_jobs,
    member_labels,
    read_members,
)
from ddlaunch.sweeps.spec import DEFAULT_METRIC
from ddlaunch.wording import counted

# States after which a member will not run again by itself and did not complete: what
# `sweep resubmit --failed` picks. STOPPED: requeues exhausted or no progress.
FAILED_STATES = frozenset(
    {"FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "SUBMIT_FAILED", "STOPPED", "BOOT_FAIL"}
)
# States in which a member still holds (or waits for) resources.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"})


@dataclass
class MemberStatus:
    index: int
    overrides: str
    run_dir: str
    job_id: str | None
    state: str
    step: int | None
    checkpoint_step: int | None
    attempts: int
    metric: Any
    note: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def member_status(
    index: int,
    label: str,
    info: RunInfo,
    queued: QueueRow | None,
    shown: dict[str, str] | None,
    metric: str = DEFAULT_METRIC,
) -> MemberStatus:
    """One member's row: the same join as ``ddlaunch status`` plus the member's metric."""
    s = run_status(info, queued, shown)
    value = (info.result or {}).get(metric) if isinstance(info.result, dict) else None
    return MemberStatus(
        index=index,
        overrides=label,
        run_dir=str(info.path),
        job_id=s.job_id,
        state=s.state,
        step=s.step,
        checkpoint_step=s.checkpoint_step,
        attempts=s.attempts or 0,
        metric=value,
        note="; ".join(p for p in (s.failure or s.detail or s.reason, *s.problems) if p),
    )


def summary(rows: Sequence[MemberStatus]) -> str:
    """``12 members: 10 COMPLETED, 1 RUNNING, 1 FAILED`` (most frequent state first)."""
    counts = Counter(r.state for r in rows)
    parts = ", ".join(f"{n} {state}" for state, n in counts.most_common())
    return f"{counted(len(rows), 'member')}: {parts}" if rows else "0 members"


def collect(sweep_dir: Path, client: SlurmClient | None = None) -> list[MemberStatus]:
    meta = read_members(sweep_dir)
    metric = meta.get("metric") or DEFAULT_METRIC
    labels = member_labels(sweep_dir, meta)  # as each member runs now
    infos = [read_run(sweep_dir / MEMBERS_DIR / str(i)) for i in range(len(labels))]
    recorded = member_jobs(sweep_dir)
    cancelled = cancelled_members(sweep_dir)
    for index, info in enumerate(infos):
        jobs = recorded.get(index)
        if jobs is None or info.job_ids or info.intent:
            continue
        # A member that has not started has no run directory yet (or a crash cut its
        # submission.json short): the arrays' records say what was submitted.
        info.job_ids = list(jobs.job_ids)
        info.cancel_requested = index in cancelled and cancelled[index] == info.job_id
        if jobs.state == "failed":
            info.intent = Intent(state="failed", error=jobs.error)
    client = client or SlurmClient()
    arrays = {i.job_id.split("_")[0] for i in infos if i.job_id}
    try:
        queue = client.array_tasks(arrays)  # the one squeue call
    except SlurmUnreachable as exc:  # the members' directories still say what they know
        queue, unreachable = {}, f"Slurm unreachable ({exc.detail})"
    else:
        unreachable = ""
    # Tasks that left the queue and whose run directory does not say how they ended (e.g.
    # cancelled while pending): one scontrol per array, only then.
    unsettled = {
        i.job_id.split("_")[0]
        for i in infos
        if i.job_id and i.job_id not in queue and not i.outcome and i.result is None
    }
    shown: dict[str, dict[str, str]] = {}
    for array in sorted(unsettled) if not unreachable else ():
        shown.update(client.show_array(array))
    # Tasks the controller forgot (MinJobAge): one batched sacct, as `ddlaunch status`.
    forgotten = [
        i.job_id
        for i in infos
        if i.job_id
        and i.job_id.split("_")[0] in unsettled
        and i.job_id not in queue
        and i.job_id not in shown
        and not i.outcome
    ]
    if forgotten and not unreachable:
        try:
            queue = {**client.accounting_rows(forgotten), **queue}
        except SlurmUnreachable as exc:
            unreachable = f"Slurm unreachable ({exc.detail})"
    rows = [
        member_status(
            index,
            label,
            info,
            queue.get(info.job_id) if info.job_id else None,
            shown.get(info.job_id) if info.job_id else None,
            metric,
        )
        for index, (label, info) in enumerate(zip(labels, infos, strict=True))
    ]
    for row in rows if unreachable else ():
        row.note = row.note or (unreachable if row.job_id else "")
    return rows


def pick_members(
    rows: Iterable[MemberStatus], *, failed: bool, cancelled: bool, named: Iterable[int]
) -> list[int]:
    """What ``sweep resubmit`` resubmits: the members ``--failed`` (FAILED_STATES) and
    ``--cancelled`` select, and those named by hand."""
    picked = {
        r.index
        for r in rows
        if (failed and r.state in FAILED_STATES) or (cancelled and r.state == "CANCELLED")
    }
    return sorted(picked | set(named))


def locate_sweep(ref: str) -> Path:
    """The sweep directory ``ref`` names: a sweep id, a unique prefix of one, or a directory
    (under the run root)."""
    return find_sweep(ref, default_run_root())


@dataclass(frozen=True)
class SweepReport:
    """``sweep status``: the sweep, one row per member, and the metric its table shows."""

    path: Path
    rows: tuple[MemberStatus, ...]

    @property
    def metric(self) -> str:
        # Read only for the table: the JSON form never needed members.json's metric.
        return str(read_members(self.path).get("metric") or DEFAULT_METRIC)

    def as_dict(self) -> dict[str, object]:
        return {
            "sweep": str(self.path),
            "summary": summary(self.rows),
            "members": [r.as_dict() for r in self.rows],
        }


def sweep_status(ref: str) -> SweepReport:
    """The rows of every member of sweep ``ref`` (one squeue call for all its arrays)."""
    path = locate_sweep(ref)
    return SweepReport(path, tuple(collect(path)))
