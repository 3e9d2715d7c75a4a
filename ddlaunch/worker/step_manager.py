"""torchft's Manager, noting whether the current step reached across the replica groups.

torchft 0.2.0's heal has the serving group publish its state at the quorum
(``send_checkpoint``, which opens its HTTP transport's lock) and withdraw it at its commit
vote (``should_commit`` calls ``disallow_checkpoint``, which takes that lock for writing).
Nothing in that exchange waits for the healing group to have fetched the state: torchft
relies on the step's cross-group all-reduce, which the healing group joins only once its
fetch is done, to hold the serving group back until then. A loop that issues no cross-group
collective in a step (one that averages within its group only: the mistake the divergence
check is there to name) lets the serving group withdraw its state first; the healing group's
fetch then waits out the transport's lock timeout (30 s) and fails with HTTP 500, and its
step with it. So ``Replica.commit`` issues a one-value all-reduce across the groups before
the vote of any step that had none (``crossed``): every group runs the same loop, so every
group issues it at the same point, and the serving group votes only after the healing group
has its state.
"""

from __future__ import annotations

from typing import Any

import torch
from torchft.manager import Manager


class StepManager(Manager):
    """A torchft ``Manager`` whose ``crossed`` says whether ``allreduce`` (the cross-group
    collective, torchft's DDP hooks included) ran since ``start_quorum``."""

    crossed = False

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        self.crossed = False
        super().start_quorum(*args, **kwargs)

    def allreduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.crossed = True
        return super().allreduce(tensor, *args, **kwargs)
