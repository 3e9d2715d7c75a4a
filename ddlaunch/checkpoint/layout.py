"""On-disk layout of a checkpoint root, and discovery of the latest *complete* checkpoint.

Torch-free on purpose: ``ddlaunch status`` and ``ddlaunch resume`` run on login nodes and
must answer "which step can we resume from?" without importing torch (DESIGN.md, principle 6).

A checkpoint root holds one directory per saved step::

    <root>/step-<N>/               N in decimal; leading zeros are accepted when reading
        __0_0.distcp ...            one shard file (or more) per rank, written by DCP
        .metadata                   DCP's global metadata, written by the coordinator last
        .ddlaunch-commit.json       ddlaunch's commit marker, written after *all* ranks agreed

A step directory is COMPLETE only when both ``.metadata`` and the commit marker exist and
the marker names the same step (torchtitan's rule plus our own marker). Anything else is
PARTIAL: a save that crashed, is still running, or failed on some rank. DCP alone is not
enough: ``.metadata`` says the coordinator finished, not that every rank's error was seen and
that the files were made durable, which is what the marker records.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.checkpoint.policy import to_delete
from ddlaunch.fsutil import atomic_write_json, fsync_dir

log = logging.getLogger(__name__)

#: Written by DCP's FileSystemWriter once the coordinator has gathered every rank's results.
DCP_METADATA = ".metadata"
#: Written by ddlaunch (rank 0) only after every rank reported a successful write.
COMMIT_MARKER = ".ddlaunch-commit.json"
#: Version of the marker's JSON shape; bump on incompatible changes.
MARKER_FORMAT = 1

# ASCII digits only: ``\d`` would also accept other Unicode digits that int() then parses.
_STEP_DIR_RE = re.compile(r"^step-([0-9]+)$")


class CheckpointState(enum.Enum):
    """Whether a step directory may be resumed from."""

    COMPLETE = "complete"
    PARTIAL = "partial"


@dataclass(frozen=True, kw_only=True)
class CommitMarker:
    """Contents of ``.ddlaunch-commit.json``."""

    step: int
    """Training step the checkpoint holds (the state *after* this step)."""
    time: float
    """Unix time at which the marker was written."""
    world_size: int
    """Number of ranks that wrote the checkpoint (a later load may use another world size)."""
    num_shard_files: int
    """Number of data files DCP's metadata refers to."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Caller's JSON metadata, e.g. the data loader position or the RNG seed."""

    def to_json(self) -> dict[str, object]:
        return {
            "format": MARKER_FORMAT,
            "step": self.step,
            "time": self.time,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time)),
            "world_size": self.world_size,
            "num_shard_files": self.num_shard_files,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_json(cls, obj: Any) -> CommitMarker:
        """Parse a marker; ValueError (with the reason) when it is not one we wrote."""
        if not isinstance(obj, dict):
            raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        fmt = obj.get("format")
        if fmt != MARKER_FORMAT:
            raise ValueError(f"unsupported marker format {fmt!r} (expected {MARKER_FORMAT})")
        try:
            step, world, files = obj["step"], obj["world_size"], obj["num_shard_files"]
            stamp = obj["time"]
        except KeyError as exc:
            raise ValueError(f"missing key {exc.args[0]!r}") from None
        # bool is an int subclass; a marker with "step": true is not ours.
        for name, value in (("step", step), ("world_size", world), ("num_shard_files", files)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(stamp, int | float) or isinstance(stamp, bool):
            raise ValueError(f"time must be a number, got {stamp!r}")
        meta = obj.get("metadata", {})
        if not isinstance(meta, dict):
            raise ValueError(f"metadata must be a JSON object, got {type(meta).__name__}")
        return cls(
            step=step, time=float(stamp), world_size=world, num_shard_files=files, metadata=meta
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """One ``step-N`` directory as found on disk."""

    step: int
    path: Path
    state: CheckpointState
    reason: str = ""
    """Why the directory is PARTIAL (empty when COMPLETE); shown by ``status``."""
    marker: CommitMarker | None = None

    @property
    def complete(self) -> bool:
        return self.state is CheckpointState.COMPLETE

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The caller's metadata saved with the checkpoint (empty when uncommitted)."""
        return self.marker.metadata if self.marker is not None else {}


def step_dir_name(step: int) -> str:
    """Directory name ddlaunch writes for ``step`` (unpadded, like torchtitan)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step}"


def parse_step_dir(name: str) -> int | None:
    """The step encoded in a directory name (``step-42``, ``step-00042``); None if not one."""
    match = _STEP_DIR_RE.match(name)
    return int(match.group(1)) if match else None


def read_commit_marker(step_dir: str | os.PathLike[str]) -> CommitMarker | None:
    """The marker of a step directory; None when absent. ValueError when it is unreadable."""
    try:
        raw = Path(step_dir, COMMIT_MARKER).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return CommitMarker.from_json(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None


def write_commit_marker(step_dir: str | os.PathLike[str], marker: CommitMarker) -> Path:
    """Commit a step directory: write the marker atomically, then make its entry durable.

    The caller must only do this after every rank finished writing (see manager.py).
    """
    target = atomic_write_json(Path(step_dir, COMMIT_MARKER), marker.to_json())
    # atomic_write_json fsyncs the step directory (so the marker and DCP's files are listed
    # durably); the step directory's own entry lives in the root, which DCP never fsyncs.
    fsync_dir(Path(step_dir).parent)
    return target


def inspect_step_dir(path: Path, step: int) -> CheckpointInfo:
    """Classify one step directory as COMPLETE or PARTIAL (with the reason)."""

    def partial(reason: str, marker: CommitMarker | None = None) -> CheckpointInfo:
        return CheckpointInfo(
            step=step, path=path, state=CheckpointState.PARTIAL, reason=reason, marker=marker
        )

    try:
        marker = read_commit_marker(path)
    except (ValueError, OSError) as exc:
        return partial(f"unreadable commit marker: {exc}")
    if not (path / DCP_METADATA).is_file():
        return partial(f"no DCP {DCP_METADATA}", marker)
    if marker is None:
        return partial("no commit marker")
    if marker.step != step:
        return partial(f"commit marker names step {marker.step}", marker)
    return CheckpointInfo(step=step, path=path, state=CheckpointState.COMPLETE, marker=marker)


def list_checkpoints(root: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """Every ``step-N`` directory under ``root``, oldest step first; [] if root is missing."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        step = parse_step_dir(entry.name)
        if step is not None and entry.is_dir():
            found.append(inspect_step_dir(Path(entry.path), step))
    # Same step under two spellings (step-5, step-05): the canonical name sorts last, so it
    # wins in latest_complete().
    found.sort(key=lambda info: (info.step, info.path.name == step_dir_name(info.step)))
    return found


def latest_complete(root: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The newest COMPLETE checkpoint, or None. Partial directories are never returned."""
    complete = [info for info in list_checkpoints(root) if info.complete]
    return complete[-1] if complete else None


def partial_dirs(root: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """Step directories that never committed (crashed, failed, or still being written)."""
    return [info for info in list_checkpoints(root) if not info.complete]


def remove_partial(
    root: str | os.PathLike[str], *, keep_newer_than_step: int | None = None
) -> list[Path]:
    """Delete uncommitted step directories with ``step <= keep_newer_than_step``.

    By default the threshold is the latest COMPLETE step: a partial directory older than a
    committed checkpoint can no longer be in progress (saves commit in step order), while a
    newer one may be a save running right now, so it is kept. Pass an explicit threshold
    (``sys.maxsize`` for all) only when no writer can be alive. Symlinked directories are
    never followed into. Returns the removed paths.
    """
    if keep_newer_than_step is None:
        latest = latest_complete(root)
        if latest is None:
            return []
        keep_newer_than_step = latest.step
    removed = []
    for info in partial_dirs(root):
        if info.step > keep_newer_than_step:
            continue
        if info.path.is_symlink():
            log.warning("not removing %s: it is a symlink", info.path)
            continue
        shutil.rmtree(info.path)
        removed.append(info.path)
    return removed


def delete_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete a step directory so that no crash can leave it looking complete.

    The marker goes first (and that removal is made durable): if we die half-way through
    the rmtree, what remains is a PARTIAL directory, never a COMPLETE one with missing shards.
    """
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"refusing to delete through a symlink: {path}")
    try:
        (path / COMMIT_MARKER).unlink()
        fsync_dir(path)
    except FileNotFoundError:
        pass
    shutil.rmtree(path)


def prune(
    root: str | os.PathLike[str], keep_last: int, *, protect: Iterable[int] = ()
) -> list[Path]:
    """Apply keep-last-K retention to COMPLETE checkpoints; returns the deleted paths.

    ``protect`` names steps never to delete (the one just committed, even if a newer step
    from an earlier attempt exists). Partial directories are left to remove_partial().
    """
    complete = [info for info in list_checkpoints(root) if info.complete]
    doomed = set(to_delete([info.step for info in complete], keep_last)) - set(protect)
    deleted = []
    for info in complete:
        if info.step in doomed and not info.path.is_symlink():
            delete_checkpoint(info.path)
            deleted.append(info.path)
    return deleted
