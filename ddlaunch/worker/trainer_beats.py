"""Heartbeats for the trainers ddlaunch does not drive but knows (``trainer.kind: hf``,
``lightning``): their ranks' steps reach ``status``, the watchdog and the report as
``Session`` code's do, with nothing changed in the user's script.

Without them such a run had no heartbeats: ``status`` could show only its latest
checkpoint's step, which stood still between saves and after the last one (a Lightning run
that trained to step 1,500 after a stop signal still said 305 when COMPLETED), and the
watchdog judged no hang. Each trainer calls one place at every step, so each rank hooks it
before the script runs and feeds a ``worker.heartbeat.Heartbeat``:

* Hugging Face: ``transformers.trainer_callback.CallbackHandler``, through which every
  Trainer calls its callbacks: ``on_step_end`` is a step (``state.global_step``);
  ``on_prediction_step`` (an evaluation batch) is progress that is not a step.
* Lightning (``lightning.pytorch``; a script on the older ``pytorch_lightning`` name is not
  hooked, which would cost every rank a second Lightning import): a callback added to every
  ``Trainer`` as it is built: ``on_train_batch_end`` is a step (``trainer.global_step``,
  which counts optimizer steps: with gradient accumulation it repeats, and the step time
  recorded is a batch's), ``on_validation_batch_end`` progress.

Progress that is not a step keeps the rank from being judged hung in a long evaluation
(``health.hang_timeout`` counts from the last of either), and counts no step time. A
trainer package that lacks the hooked names (an older or newer release) gets no beats, as
before: the hooks are looked up, never assumed.

Torch-free at import: the trainer's package is imported only when its kind is the run's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddlaunch.config.schema import Config
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker import lightning_trainers
from ddlaunch.worker.heartbeat import Heartbeat

# The one heartbeat of this process; the hooks, installed once, feed whichever is current.
_current: Heartbeat | None = None


def _step(step: object) -> None:
    if _current is not None and isinstance(step, int):
        _current.step(step)


def _progress() -> None:
    if _current is not None:
        _current.progress()


def _hook_hf() -> bool:
    try:
        from transformers import trainer_callback
    except ImportError:
        return False
    handler: Any = getattr(trainer_callback, "CallbackHandler", None)
    if handler is None or not all(
        callable(getattr(handler, name, None)) for name in ("on_step_end", "on_prediction_step")
    ):
        return False
    if getattr(handler, "_ddlaunch_beats", False):
        return True
    step_end, prediction_step = handler.on_step_end, handler.on_prediction_step

    @functools.wraps(step_end)
    def on_step_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        _step(getattr(state, "global_step", None))
        return step_end(self, args, state, control, **kwargs)

    @functools.wraps(prediction_step)
    def on_prediction_step(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        _progress()
        return prediction_step(self, args, state, control, **kwargs)

    handler.on_step_end = on_step_end
    handler.on_prediction_step = on_prediction_step
    handler._ddlaunch_beats = True
    return True


def _hook_lightning() -> bool:
    try:
        import lightning.pytorch as pl
    except ImportError:
        return False
    callback: Any = getattr(pl, "Callback", None)
    if callback is None:
        return False

    class Beats(callback):
        """ddlaunch's heartbeat: a step per optimizer step, progress per validation batch."""

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            _step(getattr(trainer, "global_step", None))

        def on_validation_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            _progress()

    return lightning_trainers.add_to_every_trainer("beats", Beats)


HOOKS: dict[str, Callable[[], bool]] = {"hf": _hook_hf, "lightning": _hook_lightning}


def start(cfg: Config, run_dir: Path, rank: int) -> Heartbeat | None:
    """The rank's heartbeat, started, with its trainer hooked; None for a kind without
    hooks, or a trainer package without the hooked names."""
    global _current
    hook = HOOKS.get(cfg.trainer_kind)
    if hook is None or not hook():
        return None
    attempt = AttemptId.from_env(os.environ)
    _current = Heartbeat.for_attempt(run_dir, rank, cfg.health.heartbeat_interval, attempt)
    _current.start()
    return _current


def stop(state: str) -> None:
    """The final record (``closed``, or ``failed``), once the script has returned or raised."""
    global _current
    if _current is not None:
        _current.stop(state)
        _current = None
