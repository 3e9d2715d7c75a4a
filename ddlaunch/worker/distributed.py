"""Process-group setup for entry points that run under ``run_rank``.

``run_rank`` has already exported the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...), pinned the CUDA device and chosen the backend (``DDLAUNCH_BACKEND``), so
joining the group is one call. torch is imported inside the functions: importing this module
stays cheap.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

BACKEND_VAR = "DDLAUNCH_BACKEND"


def init_distributed(timeout: timedelta | None = None) -> str:
    """Join the default process group (env:// rendezvous); idempotent. Returns the backend."""
    import torch
    import torch.distributed as dist

    backend = os.environ.get(BACKEND_VAR, "gloo")
    if dist.is_initialized():
        return str(dist.get_backend())
    kwargs: dict[str, object] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if backend == "nccl":
        # Binding the group to this rank's device makes NCCL set up eagerly on the right GPU
        # instead of guessing from the (possibly unpinned) current device.
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend=backend, init_method="env://", **kwargs)  # type: ignore[arg-type]
    return backend


def rank_device() -> torch.device:
    """The device this rank's tensors live on: its pinned GPU with nccl (which reduces CUDA
    tensors only), the CPU with gloo. Call after ``init_distributed``."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
