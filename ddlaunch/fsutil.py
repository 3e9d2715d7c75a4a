"""Crash-safe file writes: temp name in the same directory, fsync, rename, fsync the directory.

A reader (``status``, ``resume``, another node) therefore sees either the old file or the
new one, never a torn write, even if the writer is SIGKILLed or the node loses power.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (a rename, a new file or subdirectory) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *, durable: bool = True
) -> Path:
    """``durable=False``: temp name and rename, no fsync: never torn, even if the writer
    dies, but a power loss may lose the file. For records thousands of ranks write at once
    whose loss costs only detail (a failure record: srun's reports still name the rank), where
    two fsyncs each would load the filesystem's metadata servers at the worst moment."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_EXCL on a random name, as tempfile.mkstemp does, without importing tempfile (and
    # random, hashlib...): status and render import this module on the login node.
    tmp_name = str(target.parent / f".{target.name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        # Never leave a half-written temp file behind on failure.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    if durable:
        fsync_dir(target.parent)
    return target


def atomic_write_text(
    path: str | os.PathLike[str], text: str, mode: int = 0o644, *, durable: bool = True
) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode, durable=durable)


def atomic_write_json(
    path: str | os.PathLike[str], obj: Any, mode: int = 0o644, *, durable: bool = True
) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    return atomic_write_text(path, text, mode, durable=durable)


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Read a JSON file written by atomic_write_json; ``default`` when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default
