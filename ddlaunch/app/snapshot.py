"""The code snapshot the ranks run from (``launch.snapshot``), taken at submit time.

Without one the ranks import whatever the submitting directory holds when the job starts, so
a job that waits in the queue, or is requeued tomorrow, runs code edited after the submit.

* ``git`` (the default in a git work tree): the tracked files plus uncommitted changes, as
  ``git stash create`` (a commit of the work tree and index, HEAD when nothing changed) and
  ``git archive`` of its tree. The id is git's own tree hash, so asking whether the snapshot
  exists costs a few git commands and no copy. Untracked files and submodules are not in
  it (as with ``git stash`` and ``git archive``).
* ``copy``: every file below the directory except ``launch.snapshot_ignore`` (and the run
  root), identified by a sha256 over paths, modes and contents.

Snapshots live in ``<run root>/.snapshots/<id>`` (written under a temporary name, renamed into
place), once per content: runs, requeues and resumes of the same code share one. The run
directory's ``snapshot.json`` says which one a run uses.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.config.schema import Config
from ddlaunch.errors import UserError
from ddlaunch.runner import Runner
from ddlaunch.store.snapshots import SNAPSHOTS_DIR


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

    def record(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "path": str(self.path),
            "source": str(self.source),
            "workdir": str(self.workdir),
            "created": self.created,
            "files": self.files,
            "seconds": round(self.seconds, 3),
        }


def _git(runner: Runner, cwd: Path, *args: str) -> str | None:
    result = runner.run(["git", "--no-optional-locks", *args], cwd=str(cwd), timeout=120)
    return result.stdout.strip() if result.ok else None


def _git_tree(runner: Runner, workdir: Path) -> tuple[Path, str] | None:
    """(work tree top level, tree hash of the tracked files with uncommitted changes)."""
    top = _git(runner, workdir, "rev-parse", "--show-toplevel")
    if not top:
        return None
    if _git(runner, workdir, "rev-parse", "--verify", "-q", "HEAD") is None:
        return None  # no commit yet
    # `git stash create` commits the index and work tree without touching either (and prints
    # nothing when there is no change). It fails on unmerged paths: then the snapshot would
    # silently lack the changes, so that is an error.
    stash = runner.run(["git", "stash", "create"], cwd=str(workdir), timeout=120)
    if not stash.ok:
        said = (stash.stderr.strip() or stash.stdout.strip() or "no message").splitlines()[-1]
        raise UserError(
            f"launch.snapshot git: `git stash create` failed in {top}: {said} (unmerged "
            "paths? resolve them, or use launch.snapshot: copy or none)"
        )
    commit = stash.stdout.strip() or "HEAD"
    tree = _git(runner, workdir, "rev-parse", f"{commit}^{{tree}}")
    return (Path(top), tree) if tree else None


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


def kind_for(cfg: Config, workdir: Path, runner: Runner) -> str:
    """``launch.snapshot`` with auto resolved: git in a git work tree, else none."""
    kind = cfg.launch.snapshot
    if kind == "auto":
        return "git" if _git(runner, workdir, "rev-parse", "--show-toplevel") else "none"
    return kind


def take(
    cfg: Config, run_root: Path, workdir: Path, runner: Runner, *, store: bool = True
) -> Snapshot | None:
    """The snapshot of ``workdir`` for ``cfg`` (None for launch.snapshot none); stored under
    ``run_root`` unless ``store`` is false (``render``: its path, nothing written)."""
    started = time.monotonic()
    kind = kind_for(cfg, workdir, runner)
    if kind == "none":
        return None
    root = run_root / SNAPSHOTS_DIR
    if kind == "git":
        found = _git_tree(runner, workdir)
        if found is None:
            raise UserError(
                f"launch.snapshot is git but {workdir} is not in a git work tree with a commit "
                "(use launch.snapshot: copy or none)"
            )
        source, tree = found
        snap_id = f"git-{tree[:20]}"
        others = _git(runner, source, "ls-files", "--others", "--exclude-standard")
        untracked = tuple((others or "").splitlines())

        def fill(tmp: Path) -> None:
            script = 'git archive --format=tar "$1" | tar -x -C "$2"'
            result = runner.run(["sh", "-c", script, "sh", tree, str(tmp)], cwd=str(source))
            if not result.ok:
                raise OSError(f"git archive failed: {result.stderr.strip()}")
    else:
        source, untracked = workdir, ()
        skip = {run_root.resolve(), root.resolve()}
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
    )


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
