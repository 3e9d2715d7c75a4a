"""One stop step for every rank of a Hugging Face Trainer (``trainer.kind: hf``).

The stop signal reaches an HF script as SIGTERM, for ``TrainingArguments(enable_jit_checkpoint=
True)``. transformers' JIT checkpoint (``transformers.trainer_jit_checkpoint``, 5.x) starts a
3 s timer in each rank when SIGTERM arrives and saves at whichever of ``on_step_begin``,
``on_pre_optimizer_step`` or ``on_step_end`` that rank reaches next after it fires. The ranks
do not agree: one rank can enter the save (its collectives) while another enters the next
step's gradient all-reduce, and the job deadlocks or gloo aborts on the mismatched collective
(both seen on the dev cluster under load; ``tests/FLAKES.md``; reproduced by
``tests/test_hf_agreed_stop.py``, which signals one rank only).

``agree_on_the_stop_step`` patches the callback's class before the script runs, so that in a
run of several ranks the save happens at a step end only, and at the same one on every rank:
each step end (and epoch end), the ranks take the MAX of their local "checkpoint requested"
flags (one all-reduce of one value per optimizer step), and if any rank's timer has fired,
every rank saves there and stops. A rank whose own timer fires after that save does not save
again at the epoch end that follows. A run of one process, or without torch.distributed, keeps
transformers' own callbacks unchanged (nothing to agree with).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddlaunch.worker import rank_agreement

_Hook = Callable[..., Any]


def agree_on_the_stop_step() -> bool:
    """Patch transformers' ``JITCheckpointCallback``; False when this transformers has none
    (an older release: nothing to agree on). Idempotent."""
    try:
        from transformers import trainer_jit_checkpoint as jit
    except ImportError:
        return False
    callback = getattr(jit, "JITCheckpointCallback", None)
    if callback is None:
        return False
    if getattr(callback, "_ddlaunch_agreed", False):
        return True
    callback.on_step_begin = _mid_step(callback.on_step_begin)
    callback.on_pre_optimizer_step = _mid_step(callback.on_pre_optimizer_step)
    callback.on_step_end = _at_a_boundary(callback.on_step_end)
    callback.on_epoch_end = _at_a_boundary(callback.on_epoch_end)
    callback._ddlaunch_agreed = True
    return True


def _mid_step(original: _Hook) -> _Hook:
    def hook(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Mid-step, no rank of several saves: the others may be inside the step's
        collectives (the gradient all-reduce)."""
        if not rank_agreement.several_ranks():
            return original(self, args, state, control, **kwargs)
        return None

    return hook


def _at_a_boundary(original: _Hook) -> _Hook:
    def hook(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """A collective when several ranks run: every rank calls it at the same step end."""
        if not rank_agreement.several_ranks():
            return original(self, args, state, control, **kwargs)
        manager = self.jit_manager
        if manager is None:
            return None
        # Every rank saved at this step already (the epoch end right after the agreed step
        # end): no second save, and no all-reduce (no rank makes one here).
        if getattr(self, "_ddlaunch_saved_at", None) == state.global_step:
            return None
        if not rank_agreement.any_rank(bool(manager.is_checkpoint_requested)):
            return None
        control.should_save = False
        control.should_training_stop = True
        self._ddlaunch_saved_at = state.global_step
        manager.execute_jit_checkpoint()
        return None

    return hook
