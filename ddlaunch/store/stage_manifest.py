"""``<copy>.ddlaunch-stage.json`` beside a staged copy on a node: what the copy holds. Written
last, after the copy was renamed from its temporary name ``<copy>.partial`` into place, and
removed first when a staging changes the copy: a copy without it is not complete. Beside the
copy, not in it, so that the data directory holds the source's files and nothing else.

It keeps the source path, the number and total size of the files, a digest of every file's
relative path, size and modification time in nanoseconds (``digest``: a copy is up to date
when the source's digest is the same), and the modification time of every directory of the
copy (a file deleted from the copy on the node changes its directory's). So checking a copy
of 10,000 files costs a stat per source file and one per directory, and reading a small file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TypedDict, cast

from ddlaunch import fsutil

MANIFEST_SUFFIX = ".ddlaunch-stage.json"
PARTIAL_SUFFIX = ".partial"  # <copy>.partial: a staging under way (or cut off)
TMP_SUFFIX = ".ddlaunch-tmp"  # <file>.ddlaunch-tmp: one file being copied

Files = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns)


def path(copy: Path) -> Path:
    return copy.with_name(copy.name + MANIFEST_SUFFIX)


def digest(files: Files) -> str:
    """One hash of every file's relative path, size and mtime (order-independent)."""
    lines = sorted(f"{rel}\0{size}\0{mtime}" for rel, (size, mtime) in files.items())
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


class Manifest(TypedDict):
    """What a complete copy holds, as ``write`` records it."""

    src: str
    is_file: bool
    files: int
    bytes: int
    digest: str  # of every file's relative path, size and mtime
    dirs: dict[str, int]  # relative path ("" for the copy itself) -> mtime_ns


def read(copy: Path) -> Manifest | None:
    """The copy's manifest as written (its readers compare its fields: a changed or damaged
    one just does not match); None without one."""
    try:
        record = fsutil.read_json(path(copy))
    except (OSError, ValueError):
        return None
    return cast(Manifest, record) if isinstance(record, dict) else None


def write(copy: Path, src: str, files: Files, is_file: bool, dirs: dict[str, int]) -> None:
    """``dirs``: relative path ("" for the copy itself) -> mtime_ns of each directory."""
    record: Manifest = {
        "src": src,
        "is_file": is_file,
        "files": len(files),
        "bytes": sum(size for size, _ in files.values()),
        "digest": digest(files),
        "dirs": dirs,
    }
    fsutil.atomic_write_json(path(copy), record)


def remove(copy: Path) -> None:
    """Before the copy changes: from now on it does not count as complete."""
    target = path(copy)
    if target.exists():
        target.unlink()
        fsutil.fsync_dir(target.parent)
