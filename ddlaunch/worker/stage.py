"""Staging one data set on one node (torch-free): ``stage_one``. The node's staging as a
whole (its leader rank stages every data set, the other ranks wait, the nodes wait for each
other) is ``worker.stage_node``.

Under a lock file beside the copy (two jobs on a node that stage the same source take turns):

1. scan the source (every file's size and mtime); the copy at ``dst`` is up to date when
   its manifest (``store.stage_manifest``) has the same digest of them and none of the
   copy's directories changed since: nothing is copied (a requeue, a restart on the same
   node);
2. otherwise stage under the temporary name ``<dst>.partial``: the previous copy is renamed
   there first (so only what changed is copied), or a staging cut off earlier is picked up;
   files the source lost are deleted, new and changed ones copied (``copy``: threads, each
   file to ``<file>.ddlaunch-tmp``, its mtime set from the source, renamed; ``rsync``:
   ``rsync -a --delete``, which compares size and mtime the same way and also copies to
   temporary names); the free space is checked first (what is to be copied plus
   ``health.min_free_gb``);
3. flush the filesystem once (``syncfs``), rename ``<dst>.partial`` to ``<dst>``, write the
   manifest beside it (``<dst>.ddlaunch-stage.json``; removed before a staging changes the
   copy). A staging killed at any point leaves no copy whose manifest says it is complete:
   at worst a ``.partial`` (or a ``<dst>`` without manifest) the next staging continues.

``mode: sbcast`` sends one file to every node of the job at once (Slurm's ``sbcast``, from
the first node, after the leaders found whose copy is stale: ``worker.broadcast``); a node
the broadcast did not reach copies for itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.health import checks
from ddlaunch.planning.staging import StageTarget
from ddlaunch.policy import staging as policy
from ddlaunch.runner import Runner
from ddlaunch.store import stage_manifest as manifest

COPY_THREADS = 8  # parallel file copies: small files are latency-bound on shared filesystems


@dataclass
class Staged:
    name: str
    src: str
    dst: str
    path: str  # what $DDLAUNCH_DATA_<NAME> holds: dst, or dst/<file> for a file source
    mode: str
    state: str = "up to date"  # | "copied" | "failed"
    files: int = 0
    bytes: int = 0
    deleted: int = 0
    total_files: int = 0
    total_bytes: int = 0
    seconds: float = 0.0
    error: str = ""


def scan(src: Path) -> tuple[manifest.Files, bool]:
    """Every regular file under ``src`` (or ``src`` itself): relative path -> (size, mtime_ns).
    Symlinks to files are followed; symlinked directories are not (no loops)."""
    if src.is_file():
        st = src.stat()
        return {src.name: (st.st_size, st.st_mtime_ns)}, True
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such file or directory")
    out: manifest.Files = {}
    stack = [(src, "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), rel + "/"))
                elif entry.is_file():
                    st = entry.stat()
                    out[rel] = (st.st_size, st.st_mtime_ns)
    return out, False


def _present(copy: Path) -> manifest.Files:
    """The finished files of a partial copy (a file still under its temporary name is not)."""
    if not copy.is_dir():
        return {}
    found, _ = scan(copy)
    return {rel: meta for rel, meta in found.items() if not rel.endswith(manifest.TMP_SUFFIX)}


def directory_mtimes(root: Path) -> dict[str, int]:
    """Every directory under ``root`` (itself as ""): relative path -> mtime_ns."""
    out: dict[str, int] = {}
    stack = [(str(root), "")]
    while stack:
        directory, rel = stack.pop()
        out[rel] = os.stat(directory).st_mtime_ns
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, f"{rel}/{entry.name}" if rel else entry.name))
    return out


def up_to_date(dst: Path, src: str, files: manifest.Files) -> bool:
    """The manifest says the copy holds exactly the source's files (the same digest of paths,
    sizes and mtimes), and no directory of the copy changed since (a tmp cleaner on the node
    deleting a file changes its directory). Files are not opened or stat'ed: the data was
    flushed before the copy was renamed into place, so a file is whole or absent."""
    record = manifest.read(dst)
    if record is None or record.get("src") != src or record.get("files") != len(files):
        return False
    if record.get("digest") != manifest.digest(files):
        return False
    try:
        return all(
            os.stat(dst / rel if rel else dst).st_mtime_ns == mtime
            for rel, mtime in dict(record.get("dirs") or {"": -1}).items()
        )
    except OSError:
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the process dies, too
        yield


def _flush(directory: Path) -> None:
    """Make the copied data durable before the rename says it is complete: one syncfs of the
    node-local filesystem instead of an fsync per file."""
    import ctypes

    fd = os.open(directory, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class _Copier:
    """Copies files in threads, counting bytes; reports progress now and then."""

    def __init__(
        self, src: Path, partial: Path, progress: Callable[[int, int], None], inject: Any
    ) -> None:
        self.src, self.partial, self.progress = src, partial, progress
        self.total = 0
        self.inject = inject
        self.lock = threading.Lock()
        self.bytes = 0
        self.files = 0

    def source_of(self, rel: str, is_file: bool) -> Path:
        return self.src if is_file else self.src / rel

    def copy(self, rel: str, meta: tuple[int, int], is_file: bool) -> None:
        target = self.partial / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + manifest.TMP_SUFFIX)
        shutil.copyfile(self.source_of(rel, is_file), tmp)
        # The source's mtime marks the file as copied: a cut-off copy never has it.
        os.utime(tmp, ns=(meta[1], meta[1]))
        os.replace(tmp, target)
        with self.lock:
            self.bytes += meta[0]
            self.files += 1
            kill_after = self.inject.get("stage_kill_after_files")
            if kill_after is not None and self.files >= int(kill_after):
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection: a node dying mid-copy
            self.progress(self.bytes, self.total)  # in memory; the ticker writes it

    def run(self, files: manifest.Files, sync: policy.Sync, is_file: bool) -> None:
        self.total = sync.bytes
        with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="ddlaunch-stage") as pool:
            for future in [pool.submit(self.copy, r, files[r], is_file) for r in sync.copy]:
                future.result()


def _rsync(src: Path, partial: Path, is_file: bool, runner: Runner) -> tuple[int, int]:
    """rsync into the partial copy; returns (files, bytes) rsync transferred (``--stats``)."""
    source = str(src) if is_file else f"{src}/"
    result = runner.run(["rsync", "-a", "--delete", "--stats", source, f"{partial}/"])
    if not result.ok:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise OSError(f"rsync exited with {result.returncode}: {detail[-1] if detail else ''}")
    stats = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            stats[key.strip()] = value.strip().split(" ")[0].replace(",", "")
    files = stats.get("Number of regular files transferred", "0")
    size = stats.get("Total transferred file size", "0")
    return int(files) if files.isdigit() else 0, int(size) if size.isdigit() else 0


def _prepare_partial(dst: Path, partial: Path) -> None:
    """Stage under the temporary name, starting from what is there already."""
    manifest.remove(dst)  # from here on the copy is not complete
    if partial.exists():
        if dst.exists():  # an old copy beside a newer cut-off staging: keep the newer
            shutil.rmtree(dst)
    elif dst.exists():
        os.rename(dst, partial)
    partial.mkdir(parents=True, exist_ok=True)


def _free_space_problem(partial: Path, needed: int, min_free_gb: float) -> str | None:
    free, error = checks.free_gb(str(partial))
    if free is None:
        return f"{partial}: {error}"
    if free - needed / 1e9 < min_free_gb:
        return (
            f"{partial}: {free:.2f} GB free, needs {needed / 1e9:.2f} GB for the data plus "
            f"{min_free_gb:g} (health.min_free_gb)"
        )
    return None


@dataclass(frozen=True)
class Context:
    """What one node's staging needs besides the data set."""

    host: str
    min_free_gb: float
    inject: Mapping[str, Any]
    progress: Callable[[int, int], None]  # (bytes copied, bytes to copy)
    runner: Runner
    broadcast: Any = None  # a worker.broadcast.Broadcast for mode sbcast


def stage_one(target: StageTarget, ctx: Context) -> Staged:
    """Stage one data set on this node; never raises (a failure is the result's state)."""
    dst = Path(target.on(ctx.host))
    started = time.monotonic()
    out = Staged(target.name, target.src, str(dst), str(dst), target.mode)
    try:
        with _locked(dst.with_name(dst.name + ".lock")):
            _stage_locked(target, dst, ctx, out)
    except Exception as exc:  # any failure is this data set's finding on this node
        out.state, out.error = "failed", f"{type(exc).__name__}: {exc}"
    out.seconds = round(time.monotonic() - started, 3)
    return out


def _stage_locked(target: StageTarget, dst: Path, ctx: Context, out: Staged) -> None:
    src = Path(target.src)
    files, is_file = scan(src)
    out.total_files, out.total_bytes = len(files), sum(size for size, _ in files.values())
    if is_file:
        out.path = str(dst / src.name)
    if ctx.broadcast is not None and not is_file:
        raise ValueError(f"mode sbcast sends one file, and {src} is a directory")
    stale = not up_to_date(dst, target.src, files)
    if ctx.broadcast is not None:
        ctx.broadcast.wait_turn(stale)
    if not stale:
        return
    partial = dst.with_name(dst.name + manifest.PARTIAL_SUFFIX)
    _prepare_partial(dst, partial)
    sync = policy.diff(files, _present(partial))
    problem = _free_space_problem(partial, sync.bytes, ctx.min_free_gb)
    if problem:
        raise OSError(problem)
    for rel in sync.delete:
        os.unlink(partial / rel)
    for leftover in partial.rglob("*" + manifest.TMP_SUFFIX):
        leftover.unlink()
    ctx.progress(0, sync.bytes)
    out.files, out.bytes, out.deleted = len(sync.copy), sync.bytes, len(sync.delete)
    if target.mode == "rsync":
        out.files, out.bytes = _rsync(src, partial, is_file, ctx.runner)
    elif ctx.broadcast is None or not ctx.broadcast.receive(partial / src.name, files[src.name]):
        _Copier(src, partial, ctx.progress, ctx.inject).run(files, sync, is_file)
    _flush(partial)
    os.rename(partial, dst)
    # fsynced, with its directory; the copy's directories keep the times recorded now
    manifest.write(dst, target.src, files, is_file, directory_mtimes(dst))
    out.state = "copied"
