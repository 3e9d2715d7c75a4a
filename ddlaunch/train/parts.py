"""The optional parts of a ``Session``: the hooks a part may use at each point of the
session's story, and what a part hands back when it restored the state.

A part is an object the Session holds for one feature of ``fault_tolerance`` that changes
how the loop runs: ``train.replica_part`` (replica groups, through torchft's Manager) and
``train.inprocess_part`` (the in-process restart). The Session calls every part at the same
points, in the order of its story: restore, start, each step boundary (the boundary itself,
the stop agreement, after it, a save or none), the training calls (optimizer, gradients,
DDP), close. Every hook of ``SessionPart`` does nothing (or hands back what it was given);
a part overrides the ones it needs, so the Session never asks which parts it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Restored:
    """Where a part took this start's state from: ``step`` (None: from scratch) and, after
    an in-process restart, ``state_from`` (``saving.memory.STATE_FROM_RAM`` or ``_DISK``)."""

    step: int | None
    state_from: str | None = None


class SessionPart:
    """The hooks of a Session's part, each a no-op here (see the module's doc)."""

    # ---------------------------------------------------------------- start

    def job_place(self, rank: int, world: int) -> tuple[int, int]:
        """The job-wide rank and world of this rank, given its process group's."""
        return rank, world

    def restore(self) -> Restored | None:
        """Restore the state of this start, or None: not this part's to do (the Session
        then loads the latest complete checkpoint). The first part that restores wins."""
        return None

    def started(self, start_step: int, restored: Restored | None) -> None:
        """The state is in place (``restored``: by which part, if any); every rank calls it
        together."""

    def where(self, said: str) -> str:
        """Rank 0's ``starting from`` line: what this part adds to ``said`` or puts instead."""
        return said

    # ---------------------------------------------------------------- steps

    def steps(
        self,
        total: int,
        boundary: Callable[[int, int], None],
        started_at: Callable[[int], None],
    ) -> Iterator[int] | None:
        """The steps to yield when this part decides them (None: the Session counts from
        its start step). ``boundary(step, total)``: the Session's step boundary, for the
        part's loop to call; ``started_at(step)``: the step this start really began at, once
        the part knows it."""
        return None

    def saves(self) -> bool:
        """Whether this rank writes the job's checkpoints and progress."""
        return True

    def on_boundary(self, step: int) -> None:
        """A step boundary, after a finished background save was committed."""

    def agree_stop(self, stop: bool) -> bool:
        """Whether to stop, after the ranks agreed on ``stop`` (a collective of its own)."""
        return stop

    def after_step(self, step: int, total: int) -> None:
        """After the stop agreement, when the loop goes on."""

    def on_save(self, step: int) -> None:
        """A periodic save of ``step`` was taken (every rank together)."""

    def between_saves(self, step: int) -> None:
        """A boundary with no save (every rank together; never at the last step)."""

    # ---------------------------------------------------------------- training calls

    def optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer the loop steps, made of the one the Session was given."""
        return optimizer

    def average_gradients(self, model: torch.nn.Module) -> bool:
        """Average ``model``'s gradients this part's way; False: not this part's."""
        return False

    def wrap_ddp(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """``model`` in this part's DistributedDataParallel; None: not this part's."""
        return None

    # ---------------------------------------------------------------- end

    def close(self, final_step: int | None) -> None:
        """The Session closes (the final checkpoint, if any, is committed)."""
