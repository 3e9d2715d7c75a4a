"""A model and its optimizers as one DCP ``Stateful`` (torch): what ``Session`` checkpoints."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful


class TrainState(Stateful):
    """A model and its optimizer(s) as one DCP ``Stateful``, so that a loop needs two lines::

        state = {"train": TrainState(model, optimizer)}
        info = manager.load_latest(state)          # ... and later manager.save(step, state)

    Uses DCP's get_state_dict/set_state_dict, which handle FSDP2/DTensor parameters and
    key optimizer state by parameter name (so it survives resharding).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
        *,
        options: StateDictOptions | None = None,
    ) -> None:
        self.model = model
        self.optimizers = (
            (optimizers,) if isinstance(optimizers, torch.optim.Optimizer) else tuple(optimizers)
        )
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        if not self.optimizers:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers, options=self.options)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.optimizers:
            set_model_state_dict(self.model, state_dict["model"], options=self.options)
            return
        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=self.options,
        )
