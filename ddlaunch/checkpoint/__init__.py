"""Sharded checkpoints: torch-free discovery and policy, and a DCP manager loaded lazily.

``from ddlaunch.checkpoint import latest_complete`` works on a login node without torch;
``CheckpointManager`` (and the other names of ``manager.py``) import torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ddlaunch.checkpoint.layout import (
    COMMIT_MARKER,
    DCP_METADATA,
    CheckpointInfo,
    CheckpointState,
    CommitMarker,
    delete_checkpoint,
    latest_complete,
    list_checkpoints,
    partial_dirs,
    prune,
    read_commit_marker,
    remove_partial,
    step_dir_name,
)
from ddlaunch.checkpoint.policy import should_checkpoint, to_delete

if TYPE_CHECKING:
    from ddlaunch.checkpoint.manager import (
        CheckpointError,
        CheckpointManager,
        CheckpointSaveError,
        TrainState,
    )

_LAZY = {"CheckpointError", "CheckpointManager", "CheckpointSaveError", "TrainState"}

__all__ = [
    "COMMIT_MARKER",
    "DCP_METADATA",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointSaveError",
    "CheckpointState",
    "CommitMarker",
    "TrainState",
    "delete_checkpoint",
    "latest_complete",
    "list_checkpoints",
    "partial_dirs",
    "prune",
    "read_commit_marker",
    "remove_partial",
    "should_checkpoint",
    "step_dir_name",
    "to_delete",
]


def __getattr__(name: str) -> Any:
    # PEP 562: the torch-backed names are resolved on first access only.
    if name in _LAZY:
        from ddlaunch.checkpoint import manager

        return getattr(manager, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
