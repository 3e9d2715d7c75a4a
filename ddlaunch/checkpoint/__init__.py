"""Checkpoints on disk, torch-free: the layout of a checkpoint root and discovery of the latest
*complete* checkpoint (``layout``), any trainer's checkpoints (``adapters``), when to save
and what to delete (``policy``). Used on every side: ``status``, ``resume``, ``report``, the
batch-host hooks and the ranks. Saving them, in the ranks, is ``ddlaunch.saving``.
"""

from __future__ import annotations

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

__all__ = [
    "COMMIT_MARKER",
    "DCP_METADATA",
    "CheckpointInfo",
    "CheckpointState",
    "CommitMarker",
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
