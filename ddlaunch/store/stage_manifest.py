"""``<copy>.ddlaunch-stage.json`` beside a staged copy on a node: what the copy holds (source
path, every file's size and modification time in nanoseconds). Written last, after the copy
was renamed from its temporary name ``<copy>.partial`` into place, and removed first when a
staging changes the copy: a copy without it is not complete, a copy whose manifest lists
exactly the source's files is up to date. Beside the copy, not in it, so that the data
directory holds the source's files and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch import fsutil

MANIFEST_SUFFIX = ".ddlaunch-stage.json"
PARTIAL_SUFFIX = ".partial"  # <copy>.partial: a staging under way (or cut off)
TMP_SUFFIX = ".ddlaunch-tmp"  # <file>.ddlaunch-tmp: one file being copied

Files = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns)


def path(copy: Path) -> Path:
    return copy.with_name(copy.name + MANIFEST_SUFFIX)


def read(copy: Path) -> dict[str, Any] | None:
    try:
        record = fsutil.read_json(path(copy))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    record["files"] = {k: (int(v[0]), int(v[1])) for k, v in record.get("files", {}).items()}
    return record


def write(copy: Path, src: str, files: Files, is_file: bool) -> None:
    fsutil.atomic_write_json(
        path(copy),
        {"src": src, "is_file": is_file, "files": {k: list(v) for k, v in files.items()}},
    )


def remove(copy: Path) -> None:
    """Before the copy changes: from now on it does not count as complete."""
    target = path(copy)
    if target.exists():
        target.unlink()
        fsutil.fsync_dir(target.parent)
