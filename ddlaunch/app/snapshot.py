"""The code snapshot the ranks run from (``launch.snapshot``), taken at submit time.

Without one the ranks import whatever the submitting directory holds when the job starts, so
a job that waits in the queue, or is requeued tomorrow, runs code edited after the submit.

* ``git`` (the default in a git work tree): the tracked files plus uncommitted changes, as
  ``git stash create`` (a commit of the work tree and index, HEAD when nothing changed) and
  ``git archive`` of its tree. The id is git's own tree hash, so asking whether the snapshot
  exists costs a few git commands and no copy. Untracked files and submodules are not in
  it (as with ``git stash`` and ``git archive``), so an entry point the snapshot lacks
  (``launch.script``, or a file the entry point's import goes through, never ``git add``ed)
  is an error before anything is stored: the job would fail with ModuleNotFoundError.
* ``copy``: every file below the directory except ``launch.snapshot_ignore`` (and the run
  root), identified by a sha256 over paths, modes and contents.

Snapshots live in ``<run root>/.snapshots/<id>`` (written under a temporary name, renamed into
place), once per content: runs, requeues and resumes of the same code share one. The run
directory's ``snapshot.json`` says which one a run uses.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlaunch.app import own_package
from ddlaunch.app.own_package import OwnPackage
from ddlaunch.config.schema import Config
from ddlaunch.errors import UserError
from ddlaunch.runner import CommandResult, Runner
from ddlaunch.store.layout import SNAPSHOTS_DIR

# The record is written by submit only: render, which names the snapshot, does not load it.
if TYPE_CHECKING:
    from ddlaunch.store.snapshots import SnapshotRecord


@dataclass(frozen=True)
class Snapshot:
    kind: str  # git | copy
    id: str
    path: Path  # <run root>/.snapshots/<id>
    source: Path  # the directory snapshotted (a git work tree's top level, or the directory)
    workdir: Path  # the ranks' working directory inside the snapshot
    created: bool = False  # False: it was stored already (or not stored: render)
    files: int | None = None
    seconds: float = 0.0
    untracked: tuple[str, ...] = ()  # git: files not in the snapshot (not ignored, not added)
    # A ddlaunch/ package of the work tree the ranks would import (app.own_package): kept
    # when developing ddlaunch, else left out of the snapshot.
    own: OwnPackage | None = None

    def record(self) -> SnapshotRecord:
        from ddlaunch.store.snapshots import SnapshotRecord

        return SnapshotRecord.from_json(  # from_json: files None is recorded as null
            {
                "kind": self.kind,
                "id": self.id,
                "path": str(self.path),
                "source": str(self.source),
                "workdir": str(self.workdir),
                "created": self.created,
                "files": self.files,
                "seconds": round(self.seconds, 3),
            }
        )


def _git(runner: Runner, cwd: Path, *args: str) -> str | None:
    result = runner.run(["git", "--no-optional-locks", *args], cwd=str(cwd), timeout=120)
    return result.stdout.strip() if result.ok else None


def _git_tree(
    runner: Runner, workdir: Path, top: str, gitdir: Path | None
) -> tuple[Path, str] | None:
    """(work tree top level, tree hash of the tracked files with uncommitted changes).
    ``top``, ``gitdir``: the work tree's top level and its git directory, as ``take`` found
    them."""
    # HEAD's tree, which is also the test for a first commit: the snapshot of a clean tree
    # costs no git command more (render runs these on every call).
    head = _git(runner, workdir, "rev-parse", "--verify", "-q", "HEAD^{tree}")
    if head is None:
        return None  # no commit yet
    # `git stash create` commits the index and work tree without touching either (and prints
    # nothing when there is no change). It fails on unmerged paths, and on paths added with
    # `git add -N` (git 2.39): then the snapshot would silently lack the changes, so that is
    # an error, with git's own words.
    stash = _stash_create(runner, workdir, gitdir)
    if not stash.ok:
        lines = (stash.stderr.strip() or stash.stdout.strip() or "no message").splitlines()
        # The last line says what failed; git's first "error:" line, where there is one, why.
        said = "; ".join([*[x for x in lines[:-1] if x.startswith("error:")][:1], lines[-1]])
        raise UserError(
            f"launch.snapshot git: `git stash create` failed in {top}: {said} (unmerged "
            "paths, or paths added with `git add -N`? resolve or `git add` them, or use "
            "launch.snapshot: copy or none)"
        )
    commit = stash.stdout.strip()
    tree = _git(runner, workdir, "rev-parse", f"{commit}^{{tree}}") if commit else head
    return (Path(top), tree) if tree else None


def _stash_create(runner: Runner, workdir: Path, gitdir: Path | None) -> CommandResult:
    """``git stash create`` on a private copy of the index. It refreshes the index it reads
    and writes it back under the index's lock, so two submits from one changed work tree at
    once (a script's, a sweep beside a submit, an editor's git) failed on each other's lock:
    measured, 1 to 3 of 4 concurrent ``git stash create`` in a changed tree failed, some with
    no message at all. The copy's refresh is thrown away; the commit it makes is the same.

    The copy keeps the index's mtime (``copy2``): git tells an edit that left a file's stat
    data unchanged (within one clock tick of the index write) only by the entry being
    "racily clean", its mtime not older than the index file's. A copy with a new mtime made
    such entries look clean, and the snapshot held the committed file instead of the edit."""
    index = gitdir / "index" if gitdir else None
    argv = ["git", "stash", "create"]
    if index is None or not index.is_file():
        # No index file (or no git dir found): git's own, since an absent index file would
        # read as an empty one, every tracked file deleted.
        return runner.run(argv, cwd=str(workdir), timeout=120)
    with tempfile.TemporaryDirectory(prefix="ddlaunch-index-") as private:
        copy = Path(private) / "index"
        shutil.copy2(index, copy)
        return runner.run(argv, cwd=str(workdir), env={"GIT_INDEX_FILE": str(copy)}, timeout=120)


def _ignored(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _walk(source: Path, patterns: tuple[str, ...], skip: set[Path]) -> list[Path]:
    """Files and symlinks below ``source``, sorted, without ignored names or ``skip`` dirs."""
    out: list[Path] = []
    for top, dirs, files in os.walk(source):
        base = Path(top)
        dirs[:] = sorted(
            d for d in dirs if not _ignored(d, patterns) and (base / d).resolve() not in skip
        )
        out += [base / f for f in files if not _ignored(f, patterns)]
        out += [base / d for d in list(dirs) if (base / d).is_symlink()]
    return sorted(out)


def _copy_id(source: Path, files: list[Path]) -> str:
    import hashlib  # only copy snapshots hash files; render of a git snapshot need not load it

    digest = hashlib.sha256()
    for path in files:
        info = os.lstat(path)
        digest.update(str(path.relative_to(source)).encode() + b"\0")
        digest.update(f"{stat.S_IMODE(info.st_mode):o}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            digest.update(b"L" + os.readlink(path).encode())
        else:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _fill_copy(tmp: Path, source: Path, files: list[Path]) -> None:
    for path in files:
        target = tmp / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            os.symlink(os.readlink(path), target)
        else:
            shutil.copy2(path, target)


def _store(final: Path, fill: Any) -> tuple[bool, int]:
    """Create ``final`` by ``fill(tmp)`` under a temporary name; (created, files)."""
    if final.is_dir():
        return False, 0
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        files = sum(len(f) for _, _, f in os.walk(tmp))
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.is_dir():  # another submit stored the same content meanwhile
            return False, 0
        raise
    return True, files


@dataclass(frozen=True)
class EntryFile:
    """A file of the work tree the ranks need to start: ``launch.script``, or one the entry
    point's import goes through (a package's ``__init__.py``, the module)."""

    key: str  # launch.script | launch.entrypoint
    path: Path  # absolute, inside the work tree
    module: str = ""  # the module it is (launch.entrypoint)
    # The top-level module is also found outside the work tree (site-packages, $PYTHONPATH):
    # a snapshot without it does not stop the ranks importing it from there.
    elsewhere: bool = False


def _inside(path: Path, top: Path) -> bool:
    return path.resolve().is_relative_to(top.resolve())


def entry_files(cfg: Config, workdir: Path, source: Path) -> list[EntryFile]:
    """The files of the work tree ``source`` the ranks need to start, found as the ranks
    look: their working directory (``workdir`` in the snapshot), then the snapshot's top
    (first on their PYTHONPATH); nothing is imported. Empty where the entry point is not in
    the work tree (then it is not the snapshot's business; ``launchcheck`` says if it is
    nowhere)."""
    launch = cfg.launch
    if launch.script:
        script = workdir / launch.script  # workdir: launch.workdir already, where set
        # A script missing here is launchcheck's error, not a gap in the snapshot.
        found = script.is_file() and _inside(script, source)
        return [EntryFile("launch.script", script)] if found else []
    if not launch.entrypoint:
        return []
    module = launch.entrypoint.partition(":")[0]
    parts = module.split(".")
    outside = [p for p in sys.path if not _inside(Path(p or "."), source)]
    locations = list(dict.fromkeys([str(workdir), str(source)]))
    out: list[EntryFile] = []
    for depth in range(len(parts)):
        name = ".".join(parts[: depth + 1])
        spec = PathFinder.find_spec(name, locations)
        if spec is None:
            break
        origin = Path(spec.origin) if spec.origin and spec.has_location else None
        if origin is not None and _inside(origin, source):  # a namespace package has none
            elsewhere = depth == 0 and PathFinder.find_spec(name, outside) is not None
            out.append(EntryFile("launch.entrypoint", origin, name, elsewhere))
        locations = list(spec.submodule_search_locations or [])
        if not locations:
            break
    return out


def lacking(needed: list[EntryFile], present: set[str], source: Path) -> EntryFile | None:
    """The first file the ranks need that the snapshot (``present``: paths relative to the
    work tree's top) lacks, or None; one whose top-level module the ranks find elsewhere
    does not count (they import all of it from there)."""
    for entry in needed:
        if entry.path.resolve().relative_to(source.resolve()).as_posix() in present:
            continue
        return None if entry.elsewhere else entry
    return None


def _in_tree(runner: Runner, source: Path, tree: str, paths: list[str]) -> set[str]:
    """Which of ``paths`` (relative to the top) the snapshot's tree holds: one git command."""
    listed = _git(runner, source, "ls-tree", "-r", "--name-only", "-z", tree, "--", *paths)
    return set((listed or "").split("\0")) - {""}


def _check_entry(
    cfg: Config, workdir: Path, source: Path, tree: str, untracked: tuple[str, ...], runner: Runner
) -> None:
    """Raise when the git snapshot lacks a file the ranks need to start."""
    needed = entry_files(cfg, workdir, source)
    if not needed:
        return
    top = source.resolve()
    rel = [e.path.resolve().relative_to(top).as_posix() for e in needed]
    missing = lacking(needed, _in_tree(runner, source, tree, rel), source)
    if missing is None:
        return
    name = missing.path.resolve().relative_to(top).as_posix()
    here = missing.path.resolve()
    shown = here.relative_to(workdir.resolve()) if here.is_relative_to(workdir.resolve()) else here
    what = f"{shown} (module {missing.module})" if missing.module else str(shown)
    why, add = (
        ("untracked", "git add it") if name in untracked else ("ignored by git", "git add -f it")
    )
    raise UserError(
        f"{missing.key}: {what} is {why}, so the git snapshot the ranks run from lacks it: "
        f"{add}, or set launch.snapshot: copy (every file) or none (the live directory)"
    )


def kind_for(cfg: Config, top: str | None) -> str:
    """``launch.snapshot`` with auto resolved: git in a git work tree (``top``: its top
    level, None outside one), else none."""
    kind = cfg.launch.snapshot
    if kind == "auto":
        return "git" if top else "none"
    return kind


def take(
    cfg: Config, run_root: Path, workdir: Path, runner: Runner, *, store: bool = True
) -> Snapshot | None:
    """The snapshot of ``workdir`` for ``cfg`` (None for launch.snapshot none); stored under
    ``run_root`` unless ``store`` is false (``render``: its path, nothing written)."""
    started = time.monotonic()
    # The work tree's top level and git directory, asked once (rev-parse prints them in
    # that order): auto needs the top level to choose, git both to snapshot.
    asks_git = cfg.launch.snapshot in ("auto", "git")
    where = (
        _git(runner, workdir, "rev-parse", "--show-toplevel", "--absolute-git-dir")
        if asks_git
        else None
    )
    lines = where.splitlines() if where else []
    top = lines[0] if lines else None
    gitdir = Path(lines[1]) if len(lines) > 1 else None
    kind = kind_for(cfg, top)
    if kind == "none":
        return None
    root = run_root / SNAPSHOTS_DIR
    if kind == "git":
        found = _git_tree(runner, workdir, top, gitdir) if top else None
        if found is None:
            raise UserError(
                f"launch.snapshot is git but {workdir} is not in a git work tree with a commit "
                "(use launch.snapshot: copy or none)"
            )
        source, tree = found
        own = own_package.find(source, workdir)
        snap_id = f"git-{tree[:20]}{_without(own)}"
        others = _git(runner, source, "ls-files", "--others", "--exclude-standard")
        untracked = tuple((others or "").splitlines())
        _check_entry(cfg, workdir, source, tree, untracked, runner)

        # Pathspecs that leave out a ddlaunch/ package the ranks must not import.
        left_out = [f":(exclude){p}" for p in own.left_out] if own else []
        pathspecs = ["--", ".", *left_out] if left_out else []

        def fill(tmp: Path) -> None:
            script = 'dest=$1; shift; git archive --format=tar "$@" | tar -x -C "$dest"'
            argv = ["sh", "-c", script, "sh", str(tmp), tree, *pathspecs]
            result = runner.run(argv, cwd=str(source))
            if not result.ok:
                raise OSError(f"git archive failed: {result.stderr.strip()}")
    else:
        source, untracked = workdir, ()
        own = own_package.find(source, workdir)
        skip = {run_root.resolve(), root.resolve()}
        skip |= {(source / p).resolve() for p in (own.left_out if own else ())}
        files = _walk(source, cfg.launch.snapshot_ignore, skip)
        snap_id = f"copy-{_copy_id(source, files)}"

        def fill(tmp: Path) -> None:
            _fill_copy(tmp, source, files)

    path = root / snap_id
    created, count = _store(path, fill) if store else (False, 0)
    inside = workdir.resolve().relative_to(source.resolve())
    return Snapshot(
        kind,
        snap_id,
        path,
        source,
        path / inside,
        created,
        count if created else None,
        time.monotonic() - started,
        untracked,
        own,
    )


def _without(own: OwnPackage | None) -> str:
    """The id's suffix for a git snapshot that leaves packages out: the same tree without
    them is other content."""
    if own is None or not own.left_out:
        return ""
    import hashlib

    return "-without-" + hashlib.sha256("\0".join(own.left_out).encode()).hexdigest()[:8]


def live_entrypoint_warning(cfg: Config, snapshot: Snapshot | None) -> str | None:
    """A warning when the entry point's package comes from outside the snapshot and outside
    site-packages (an editable install, $PYTHONPATH): the ranks import that live code."""
    if snapshot is None or not cfg.launch.entrypoint:
        return None
    import importlib.util

    top = cfg.launch.entrypoint.split(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)  # finds the top-level package, imports nothing
    except (ImportError, ValueError):
        return None
    location = spec.origin if spec and spec.origin else None
    if location is None and spec and spec.submodule_search_locations:
        location = next(iter(spec.submodule_search_locations), None)
    if location is None or location in ("built-in", "frozen"):
        return None
    where = Path(location).resolve()
    if where.is_relative_to(snapshot.source.resolve()) or any(
        part in ("site-packages", "dist-packages") for part in where.parts
    ):
        return None
    package = where.parent if where.name == "__init__.py" else where
    return (
        f"launch.entrypoint {cfg.launch.entrypoint} is imported from {package}, outside the "
        f"snapshot of {snapshot.source} (an editable install or $PYTHONPATH): the ranks run "
        "that live code, so edits after this submit reach the job"
    )
