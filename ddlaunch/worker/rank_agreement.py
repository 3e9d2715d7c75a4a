"""One decision for every rank of a trainer ddlaunch does not drive: whether any rank holds a
flag (a stop signal it received), taken at a point every rank reaches in the same order (a
step end), so that all of them act at the same step.

Used where a trainer acts on a signal in each rank alone (Hugging Face's JIT checkpoint,
``worker.hf_stop``; Lightning's Slurm auto-requeue save, ``worker.lightning_stop``): a save is
a collective, and ranks that enter it at different points of the step deadlock against the
gradients' all-reduce, or gloo aborts on the mismatch.
"""

from __future__ import annotations


def several_ranks() -> bool:
    """Whether this process is one rank of a process group of more than one."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank: one all-reduce (MAX) of one value on the default
    group, so every rank must call it at the same point. On NCCL the value lives on this
    rank's current device, as NCCL requires."""
    import torch
    import torch.distributed as dist

    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
