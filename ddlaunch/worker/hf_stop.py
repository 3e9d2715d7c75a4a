"""One stop step for every rank of a Hugging Face Trainer (``trainer.kind: hf``).

The stop signal reaches an HF script as SIGTERM, for ``TrainingArguments(enable_jit_checkpoint=
True)``. transformers' JIT checkpoint (``transformers.trainer_jit_checkpoint``, 5.x) starts a
3 s timer in each rank when SIGTERM arrives and saves at whichever of ``on_step_begin``,
``on_pre_optimizer_step`` or ``on_step_end`` that rank reaches next after it fires. The ranks
do not agree: one rank can enter the save (its collectives) while another enters the next
step's gradient all-reduce, and the job deadlocks or gloo aborts on the mismatched collective
(both seen on the dev cluster under load; ``tests/FLAKES.md``).

``agree_on_the_stop_step`` patches the callback's class before the script runs, so that the
save happens at a step end only, and at the same one on every rank: each step end, the
ranks take the MAX of their local "checkpoint requested" flags (one all-reduce of one
value per optimizer step; a few microseconds on NCCL, well under a millisecond on gloo),
and if any rank's timer has fired, every rank saves there and stops. A run of one process,
or without torch.distributed, keeps transformers' own behaviour.
"""

from __future__ import annotations

from typing import Any


def agree_on_the_stop_step() -> bool:
    """Patch transformers' ``JITCheckpointCallback``; False when this transformers has none
    (an older release: nothing to agree on)."""
    try:
        from transformers import trainer_jit_checkpoint as jit
    except ImportError:
        return False
    callback = getattr(jit, "JITCheckpointCallback", None)
    if callback is None or getattr(callback, "_ddlaunch_agreed", False):
        return callback is not None
    callback.on_step_begin = _never  # type: ignore[method-assign]
    callback.on_pre_optimizer_step = _never  # type: ignore[method-assign]
    callback.on_step_end = _at_the_agreed_step  # type: ignore[method-assign]
    callback.on_epoch_end = _at_the_agreed_step  # type: ignore[method-assign]
    callback._ddlaunch_agreed = True
    return True


def _never(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    """Mid-step, no rank saves: the other ranks may be inside the step's collectives."""


def _at_the_agreed_step(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    manager = self.jit_manager
    if manager is None:
        return
    if not _any_rank(bool(manager.is_checkpoint_requested)):
        return
    control.should_save = False
    control.should_training_stop = True
    manager.execute_jit_checkpoint()


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank calls this at the same step end)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
