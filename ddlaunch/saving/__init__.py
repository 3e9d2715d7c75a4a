"""In-rank checkpoint saving (torch): the DCP manager that saves, commits, retains and
restores a run's sharded checkpoints (``manager``), its agreement collectives
(``agreement``), the CPU staging of asynchronous saves (``staging``) and the model and
optimizers as one ``Stateful`` (``state``). Imported by the ranks only (``ddlaunch.train``);
what every other place needs of checkpoints, torch-free, is ``ddlaunch.checkpoint``.
"""

from __future__ import annotations

from ddlaunch.saving.manager import (
    CheckpointError,
    CheckpointManager,
    CheckpointSaveError,
    TrainState,
)

__all__ = ["CheckpointError", "CheckpointManager", "CheckpointSaveError", "TrainState"]
