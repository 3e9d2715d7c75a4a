"""The typed values the Python API hands out: a run's status and its attempts, and what a
dry run would submit. Frozen: a value is what one poll saw, never updated behind the caller.

Made from the rows ``app.status_poll.view`` joins (the same rows ``status --json`` prints),
so the API and the CLI cannot disagree about a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddlaunch.app.status import RunStatus as Row
    from ddlaunch.store.inprocess import InProcessRestart
    from ddlaunch.store.standbys import StandbyBook


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One attempt of a run: where it ran, how it ended and why (``status RUN``'s lines)."""

    attempt: int | None
    """Its number, from 0."""
    job_id: str | None
    """The Slurm job it ran in (None: a local run)."""
    nodes: str
    """Its nodes, as Slurm writes a node list."""
    start: float | None
    """When it started (seconds since the epoch)."""
    end: float | None
    """When it ended; None while it runs."""
    cause: str
    """How it ended (``completed``, ``crash``, ``timeout``, ...; ``running`` while it runs)."""
    resumed_from: int | None
    """The checkpoint step it started from; None: from scratch."""
    committed_step: int | None
    """The latest step committed when it ended."""
    blamed: tuple[str, ...] = ()
    """Nodes this attempt blamed (excluded from the next one)."""
    detail: str | None = None
    """The health verdict or signal behind the ending."""
    culprit: str | None = None
    """Which rank ended it, where and how."""
    in_allocation: bool = False
    """A restart inside the same allocation (a new srun step, no requeue)."""
    shrunk: str | None = None
    """Set when it ran on fewer nodes than ``nodes.count`` (``nodes.min``)."""
    in_process_restarts: tuple[InProcessRestart, ...] = ()
    """``fault_tolerance.restart: in_process``: each rank failure the ranks met in their
    own processes, in order (the dead ranks, the standbys that took them, where the state
    came from, or why it fell back)."""
    standbys: StandbyBook | None = None
    """While it runs with ``restart: in_process``: its standbys, how many wait on each node
    and which took a rank (``standbys.json``)."""


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """A run as one poll saw it: the data ``ddlaunch status --json`` prints, typed.

    ``state`` is one of the few states a user acts on: PENDING, RUNNING, SUSPENDED (the job
    is alive) or COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, STOPPED,
    SUBMIT_FAILED (it ended), or UNKNOWN (neither Slurm nor the run directory can say).
    """

    run_id: str
    """The run's id (a sweep member's: ``SWEEP/<i>``)."""
    path: Path | None
    """Its run directory (None for a sweep's summary row)."""
    job_id: str | None
    """Its latest Slurm job id (None: never submitted to Slurm)."""
    state: str
    """Its state (see above)."""
    nodes: str
    """The nodes it runs or ran on."""
    reason: str
    """Why a PENDING job waits, as Slurm says; else empty."""
    step: int | None
    """The training step it reached."""
    checkpoint: int | None
    """The step of its latest complete checkpoint."""
    attempts: int | None
    """How many attempts it made."""
    failure: str | None
    """How its latest attempt failed (which rank, where, how), said once the run ended;
    None when nothing failed."""
    failing: str | None = None
    """While the run has not ended: what failed in its running attempt, as a rank's record
    says it with the verdict pending (``rank 3 on node4 failed, verdict pending: ...``), or
    the verdict once one is recorded (``node failure of node4: ...``); None when nothing
    failed, and once the run ended (``failure`` then says it)."""
    detail: str | None
    """How it ended, in words (the run's ``outcome.json``)."""
    label: str | None = None
    """A sweep member's overrides."""
    history: tuple[Attempt, ...] = ()
    """Every attempt, oldest first."""
    excluded: tuple[str, ...] = ()
    """Nodes excluded from its next attempt."""
    health: str = ""
    """Node health in one line (preflight, blamed nodes, heartbeat age)."""
    snapshot: str | None = None
    """The code snapshot its ranks run from."""
    submitted: float | None = None
    """When it was submitted (seconds since the epoch)."""
    members: Mapping[str, int] | None = None
    """A sweep's summary row: its members per state."""
    problems: tuple[str, ...] = ()
    """Records of the run directory that could not be read, and why."""
    batch_shares: str | None = None
    """``balance: by_throughput``: the shares of the global batch its ranks train with, in
    one line (``fast 40/rank x4, slow 24/rank x4 (by throughput: ...)``)."""

    @property
    def ended(self) -> bool:
        """Whether the run reached a final state (not alive, and not UNKNOWN)."""
        from ddlaunch.app.status import ACTIVE_STATES

        return self.state not in ACTIVE_STATES and self.state != "UNKNOWN"

    @property
    def completed(self) -> bool:
        """Whether the run completed."""
        return self.state == "COMPLETED"

    @classmethod
    def from_row(cls, row: Row) -> RunStatus:
        """The value of one of ``app.status``'s rows (what ``status --json`` prints)."""
        return cls(
            run_id=row.run_id,
            path=Path(row.path) if row.path else None,
            job_id=row.job_id,
            state=row.state,
            nodes=row.nodes,
            reason=row.reason,
            step=row.step,
            checkpoint=row.checkpoint_step,
            attempts=row.attempts,
            failure=row.failure,
            failing=row.failing,
            detail=row.detail,
            label=row.label,
            history=tuple(_attempt(item) for item in row.history),
            excluded=tuple(row.excluded),
            health=row.health,
            snapshot=row.snapshot,
            submitted=row.submitted,
            members=MappingProxyType(dict(row.members)) if row.members is not None else None,
            problems=tuple(row.problems),
            batch_shares=row.batch_shares,
        )


def _attempt(item: Mapping[str, Any]) -> Attempt:
    from ddlaunch.store.inprocess import InProcessRestart
    from ddlaunch.store.standbys import StandbyBook

    book = item.get("standbys")
    return Attempt(
        attempt=item.get("attempt"),
        job_id=item.get("job_id"),
        nodes=str(item.get("nodes") or ""),
        start=item.get("start"),
        end=item.get("end"),
        cause=str(item.get("cause") or ""),
        resumed_from=item.get("resumed_from"),
        committed_step=item.get("committed_step"),
        blamed=tuple(item.get("blamed") or ()),
        detail=item.get("detail"),
        culprit=item.get("culprit"),
        in_allocation=bool(item.get("in_allocation")),
        shrunk=item.get("shrunk"),
        in_process_restarts=tuple(
            InProcessRestart.from_mapping(e) for e in item.get("in_process_restarts") or ()
        ),
        standbys=StandbyBook.from_mapping(book) if isinstance(book, Mapping) else None,
    )


@dataclass(frozen=True, kw_only=True)
class DryRun:
    """What ``submit(..., dry_run=True)`` would have submitted; nothing was created."""

    run_id: str
    """The id the run would have had."""
    run_dir: Path
    """Where its run directory would have been (it was not created)."""
    script: str
    """The batch script, exactly as ``submit`` would write it."""
    sbatch_argv: tuple[str, ...]
    """The exact sbatch command line."""
    warnings: tuple[str, ...] = ()
    """What ``submit`` would have warned about."""
