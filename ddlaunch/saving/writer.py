"""DCP's file writer as ddlaunch's checkpoints use it (torch): every file fsynced, one file
per rank, and no zip CRC32 over the shards' bytes.

DCP writes each tensor of a shard file with ``torch.save``, whose zip writer computes a
CRC32 of every record. That checksum was the largest part of a sync save's CPU time after
the copy to the page cache (1 GiB over 4 ranks on a 2-core VM: the save reached 57 % of
four parallel ``dd conv=fsync`` streams with it, see docs/explanation/benchmarks.md), and it
protects nothing here: ``torch.load``, which DCP's reader calls on each record, never
checks it (a flipped byte loads as a wrong value either way), and a ``.distcp`` file is a
concatenation of archives that no zip tool opens as a whole. What makes a checkpoint
trustworthy is unchanged: each shard file and ``.metadata`` are fsynced before the commit
marker is written.

torch reads the switch from a process-wide setting
(``torch.utils.serialization.config.save.compute_crc32``); flipping it during a write
would also drop the checksum of any ``torch.save`` the training loop makes meanwhile (an
async save writes beside the loop). So the switch is made per thread instead:
``torch.serialization.get_crc32_options``, which ``torch.save`` calls when it opens its zip
writer, is wrapped once by a function that answers False in a thread that is writing a
checkpoint's shards and asks the original everywhere else. Every other caller sees
torch's own setting, unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
import torch.serialization
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner

_writing = threading.local()
_install_lock = threading.Lock()


def _no_crc_while_writing(original: Callable[[], bool]) -> Callable[[], bool]:
    def get_crc32_options() -> bool:
        return False if getattr(_writing, "shards", False) else original()

    get_crc32_options.__wrapped__ = original  # type: ignore[attr-defined]
    get_crc32_options.__doc__ = original.__doc__
    return get_crc32_options


def install() -> bool:
    """Wrap ``torch.serialization.get_crc32_options`` (once per process); False where this
    torch has no such function (then the shards keep their CRC32, as before)."""
    with _install_lock:
        current = getattr(torch.serialization, "get_crc32_options", None)
        if current is None:
            return False
        if not hasattr(current, "__wrapped__"):
            torch.serialization.get_crc32_options = _no_crc_while_writing(current)
        return True


class ShardWriter(dcp.FileSystemWriter):
    """``FileSystemWriter(sync_files=True, overwrite=False)`` whose shards are written
    without the zip CRC32 (see the module's doc). One writer thread per rank (DCP's
    default ``thread_count=1``: the thread that runs the save writes, so the per-thread
    switch covers every record), one file per rank."""

    def __init__(self, path: str | Path) -> None:
        # sync_files: fsync each shard and .metadata; the marker must mean "durable".
        # overwrite=False: the manager emptied the directory; a .metadata found there now
        # means a second writer, and failing beats mixing two checkpoints.
        super().__init__(path, sync_files=True, overwrite=False)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        install()
        before = getattr(_writing, "shards", False)
        _writing.shards = True
        try:
            return super().write_data(plan, planner)
        finally:
            _writing.shards = before
