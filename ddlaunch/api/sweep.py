"""``Sweep``: one sweep directory, re-attached from any process by its id, an id prefix or its
path, and ``sweep()``, which submits a sweep file. Every method calls the use case the
matching ``ddlaunch sweep`` verb calls (``sweeps.submit_file``, ``sweeps.status``,
``sweeps.resubmit``, ``app.cancel``) and returns values instead of printing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddlaunch.api.run import Run


@dataclass(frozen=True)
class MemberState:
    """One member as ``ddlaunch sweep status SWEEP --json`` prints it: its number, its
    overrides as it runs now (``key=now (was before)`` for a key changed since the sweep made
    it, e.g. by ``resubmit(set=...)``), its run directory (absent until it starts), its job,
    state, step, checkpoint step, attempts, the sweep's metric from its result, and a note."""

    index: int
    overrides: str
    run_dir: Path
    job_id: str | None
    state: str
    step: int | None
    checkpoint_step: int | None
    attempts: int
    metric: Any
    note: str


@dataclass(frozen=True)
class Member:
    """One member as the sweep defines it (no Slurm call): its number, its overrides as it
    runs now (as ``MemberState``'s), and the run directory it has once it started."""

    index: int
    overrides: str
    run_dir: Path


@dataclass(frozen=True)
class SweepStatus:
    """Every member's state now (one queue query for all the sweep's arrays)."""

    sweep_id: str
    members: tuple[MemberState, ...]
    summary: str  # "4 members: 3 COMPLETED, 1 FAILED", as the CLI prints it

    def count(self, state: str) -> int:
        return sum(1 for m in self.members if m.state == state)

    @property
    def ended(self) -> bool:
        """No member is queued, running or suspended."""
        from ddlaunch.sweeps.status import LIVE_STATES

        return not any(m.state in LIVE_STATES for m in self.members)


@dataclass(frozen=True)
class ArrayResult:
    """One job array a submission or resubmission sent to sbatch: its name in the sweep,
    its members, its job id, or why sbatch refused it (its members were not submitted)."""

    name: str
    members: tuple[int, ...]
    job_id: str | None
    error: str | None = None


class Sweep:
    """A sweep, found by ``ref``: a sweep id, a unique id prefix or a sweep directory, under
    ``run_root`` (default: ``$DDLAUNCH_RUN_ROOT`` or the built-in root). An unknown or
    ambiguous ``ref`` raises ``UserError`` at once."""

    def __init__(self, ref: str | os.PathLike[str], run_root: str | os.PathLike[str] | None = None):
        from ddlaunch.store.rundir import default_run_root
        from ddlaunch.store.sweeps import find_sweep

        root = Path(run_root) if run_root is not None else default_run_root()
        self._dir = find_sweep(str(ref), root)
        self._arrays: tuple[ArrayResult, ...] = ()

    def __repr__(self) -> str:
        return f"Sweep({str(self._dir)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sweep) and other._dir == self._dir

    def __hash__(self) -> int:
        return hash(self._dir)

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def id(self) -> str:
        return self._dir.name

    @property
    def arrays(self) -> tuple[ArrayResult, ...]:
        """What the ``sweep()`` or ``resubmit()`` that returned this object submitted."""
        return self._arrays

    @property
    def members(self) -> tuple[Member, ...]:
        """Every member, in order, from the sweep's ``members.json`` (no Slurm call)."""
        from ddlaunch.store.sweeps import member_run_dirs

        return tuple(
            Member(i, label, run_dir)
            for i, (label, run_dir) in enumerate(member_run_dirs(self._dir))
        )

    def member(self, index: int) -> Run:
        """Member ``index`` (from 0, as ``members``) as a ``Run``. ``UserError``: the sweep has
        no such member, or it has not started yet (a member's run directory is made at its
        first start)."""
        from ddlaunch.api.run import Run
        from ddlaunch.app.run_refs import sweep_member

        return Run._at(sweep_member(self._dir, index))

    def status(self) -> SweepStatus:
        """Every member's state, as ``ddlaunch sweep status SWEEP --json``."""
        from ddlaunch.sweeps.status import collect, summary

        rows = collect(self._dir)
        members = tuple(
            MemberState(
                index=r.index,
                overrides=r.overrides,
                run_dir=Path(r.run_dir),
                job_id=r.job_id,
                state=r.state,
                step=r.step,
                checkpoint_step=r.checkpoint_step,
                attempts=r.attempts,
                metric=r.metric,
                note=r.note,
            )
            for r in rows
        )
        return SweepStatus(self.id, members, summary(rows))

    def resubmit(
        self,
        *,
        failed: bool = False,
        cancelled: bool = False,
        members: Iterable[int] = (),
        set: Sequence[str] = (),
        force: bool = False,
        hold: bool = False,
    ) -> Sweep:
        """Submit members again (``failed``, ``cancelled``, those named), each from its own
        latest complete checkpoint, as ``ddlaunch sweep resubmit``. Returns this sweep with
        ``arrays`` set; ``UserError`` for a refusal (nothing chosen is not one: ``arrays``
        is then empty)."""
        from ddlaunch.sweeps.events import ArraysSubmitted
        from ddlaunch.sweeps.resubmit import resubmit

        events = resubmit(
            str(self._dir),
            failed=failed,
            cancelled=cancelled,
            members=list(members),
            overrides=list(set),
            dry_run=False,
            max_array_size=None,
            hold=hold,
            force=force,
        )
        return self._with(_arrays_of(e for e in events if isinstance(e, ArraysSubmitted)))

    def cancel(self, wait: float = 120.0) -> SweepStatus:
        """Cancel every member's job (one ``scancel`` for the sweep's arrays), wait up to
        ``wait`` seconds for them to leave the queue, and return the status after it."""
        from ddlaunch.app.cancel import cancel

        cancel([str(self._dir)], wait_s=wait)
        return self.status()

    def _with(self, arrays: tuple[ArrayResult, ...]) -> Sweep:
        made = Sweep.__new__(Sweep)
        made._dir, made._arrays = self._dir, arrays
        return made


def _arrays_of(events: Iterable[Any]) -> tuple[ArrayResult, ...]:
    return tuple(
        ArrayResult(o.name, tuple(o.members), o.job_id, o.error)
        for event in events
        for o in event.outcomes
    )


def sweep(
    file: str | os.PathLike[str],
    set: Sequence[str] = (),
    *,
    run_root: str | os.PathLike[str] | None = None,
    force: bool = False,
    hold: bool = False,
) -> Sweep:
    """Submit the sweep file ``file`` (``set`` applies to every member) as job arrays, as
    ``ddlaunch sweep FILE``: every member is validated before anything is written or
    submitted (``ConfigError`` names the member and the key). Returns the ``Sweep`` with
    ``arrays`` set; an array sbatch refused has its ``error`` (its members can be
    resubmitted)."""
    from ddlaunch.sweeps.events import ArraysSubmitted
    from ddlaunch.sweeps.submit_file import submit_sweep_file

    events = list(
        submit_sweep_file(
            str(file),
            list(set),
            dry_run=False,
            run_root=str(run_root) if run_root is not None else None,
            max_array_size=None,
            hold=hold,
            force=force,
        )
    )
    submitted = [e for e in events if isinstance(e, ArraysSubmitted)]
    (done,) = submitted
    made = Sweep.__new__(Sweep)
    made._dir, made._arrays = done.sweep_dir.absolute(), _arrays_of(submitted)
    return made
