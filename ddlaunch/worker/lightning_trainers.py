"""A callback of ddlaunch's in every ``lightning.pytorch`` ``Trainer`` a rank builds, with
nothing changed in the user's script: ``Trainer.__init__`` is wrapped once per purpose (the
heartbeats, ``worker.trainer_beats``; the agreed stop step, ``worker.lightning_stop``), and
appends a new callback to the trainer's list after Lightning has built it.

A script on the older ``pytorch_lightning`` name is not hooked: that would cost every rank a
second Lightning import.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def add_to_every_trainer(purpose: str, make: Callable[[], Any]) -> bool:
    """From now on every Trainer gets ``make()`` among its callbacks; once per ``purpose``.
    False when Lightning is not installed or lacks ``Trainer``."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        return False
    trainer: Any = getattr(pl, "Trainer", None)
    if trainer is None:
        return False
    mark = f"_ddlaunch_{purpose}"
    if getattr(trainer, mark, False):
        return True
    init = trainer.__init__

    # wraps: the signature stays the Trainer's own for what reads it (LightningCLI builds its
    # command line from it).
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        callbacks = getattr(self, "callbacks", None)
        if isinstance(callbacks, list):
            callbacks.append(make())

    trainer.__init__ = __init__
    setattr(trainer, mark, True)
    return True
