"""The checkpoint manager's agreement collectives (torch): every rank learns the same answer
(rank 0's decision, whether every rank succeeded), so none is left waiting in a collective
that another rank skipped, and all raise the same error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint operation failed; raised on every rank alike, so none is left waiting."""


class CheckpointSaveError(CheckpointError):
    """A save did not commit; its directory stays uncommitted and older checkpoints stay."""

    def __init__(self, message: str, *, step: int, failed_ranks: list[int]) -> None:
        super().__init__(message)
        self.step = step
        self.failed_ranks = failed_ranks


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
        dist.all_gather_object(everyone, blame, group=self._ctl_pg)
        failed = sorted({rank for ranks in everyone for rank in ranks})
        local = f"; here: {type(error).__name__}: {error}" if error is not None else ""
        raise CheckpointSaveError(
            f"checkpoint step {step}: {what} failed on rank(s) {failed}; left uncommitted{local}",
            step=step,
            failed_ranks=failed,
        ) from error
