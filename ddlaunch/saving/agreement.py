"""The checkpoint manager's agreement collectives (torch): every rank learns the same answer
(rank 0's decision, whether every rank succeeded), so none is left waiting in a collective
that another rank skipped, and all raise the same error."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ddlaunch.wording import plural

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint operation failed; raised on every rank alike, so none is left waiting."""


class CheckpointSaveError(CheckpointError):
    """A save did not commit; its directory stays uncommitted and older checkpoints stay.
    ``reason``: one line for the run's outcome, ``checkpoint save failed: no space left on
    <dir>`` when a rank's write hit ENOSPC (or EDQUOT)."""

    def __init__(
        self, message: str, *, step: int, failed_ranks: list[int], reason: str = ""
    ) -> None:
        super().__init__(message)
        self.step = step
        self.failed_ranks = failed_ranks
        self.reason = reason or f"checkpoint save failed at step {step}"


# A full filesystem (or quota) says so in the errno of an OSError somewhere in the chain:
# DCP wraps each rank's exception in CheckpointException.failures, rank 0's errors travel
# as text ("OSError: [Errno 28] No space left on device").
_SPACE = {errno.ENOSPC: "no space left on", errno.EDQUOT: "disk quota exceeded on"}


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [error] if error is not None else []
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        failures = getattr(exc, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values() if isinstance(f, tuple) and f]
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]


def space_problem(error: BaseException | None) -> str | None:
    """``no space left on`` / ``disk quota exceeded on`` when ``error`` comes from a full
    filesystem, else None."""
    for exc in _chain(error):
        if isinstance(exc, OSError) and exc.errno in _SPACE:
            return _SPACE[exc.errno]
        text = str(exc)
        for number, words in _SPACE.items():
            if f"[Errno {number}]" in text:
                return words
    return None


def marker_failed(error: CheckpointError, step: int, where: str) -> CheckpointSaveError:
    """Rank 0 could not write the commit marker (every rank got its error from on_rank0)."""
    space = space_problem(error)
    return CheckpointSaveError(
        f"checkpoint step {step}: writing the commit marker failed: {error}",
        step=step,
        failed_ranks=[0],
        reason=f"checkpoint save failed: {space} {where}" if space else "",
    )


class Agreement:
    """Collectives on the manager's control group (gloo, its own: see ``manager``)."""

    def __init__(self, group: Any, rank: int, world_size: int, where: str) -> None:
        self._ctl_pg, self.rank, self.world_size, self.where = group, rank, world_size, where

    def on_rank0(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 and give every rank its result, or raise its error on all."""
        box: list[Any] = [None, None]
        if self.rank == 0:
            try:
                box = [fn(), None]
            except Exception as exc:
                box = [None, f"{type(exc).__name__}: {exc}"]
        dist.broadcast_object_list(box, group=self._ctl_pg, group_src=0)
        if box[1] is not None:
            raise CheckpointError(f"rank 0 failed under {self.where}: {box[1]}")
        return box[0]

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (one small all-reduce)."""
        mine = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(mine, op=dist.ReduceOp.MIN, group=self._ctl_pg)
        return bool(mine.item())

    def gather_flags(self, flag: bool) -> list[bool]:
        mine = torch.tensor([int(flag)], dtype=torch.int32)
        everyone = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine, group=self._ctl_pg)
        return [bool(t.item()) for t in everyone]

    def raise_unless_all(self, ok: bool, what: str, step: int, error: BaseException | None) -> None:
        """All ranks learn whether every rank succeeded; if not, all raise the same error."""
        if all(self.gather_flags(ok)):  # the common case: one small tensor collective
            return
        # Each rank says whom it blames: DCP re-raises one rank's failure on every rank as a
        # CheckpointException that names the culprits; any other error blames this rank.
        blame: list[int] = []
        if not ok:
            failures = getattr(error, "failures", None)
            blame = sorted(failures) if isinstance(failures, dict) and failures else [self.rank]
        everyone: list[Any] = [None] * self.world_size
        # With each rank's blame, whether its error came from a full filesystem: every rank
        # then words the failure alike, whichever rank's write hit ENOSPC.
        mine = (blame, space_problem(error) if not ok else None)
        dist.all_gather_object(everyone, mine, group=self._ctl_pg)
        failed = sorted({rank for ranks, _ in everyone for rank in ranks})
        space = next((words for _, words in everyone if words), None)
        local = f"; here: {type(error).__name__}: {error}" if error is not None else ""
        reason = f"checkpoint save failed: {space} {self.where}" if space else ""
        head = f"{reason} (step {step})" if reason else f"checkpoint step {step}"
        raise CheckpointSaveError(
            f"{head}: {what} failed on {plural(len(failed), 'rank')} {failed}; "
            f"left uncommitted{local}",
            step=step,
            failed_ranks=failed,
            reason=reason,
        ) from error
