"""The sweep directory on disk, written before the first sbatch (see ``sweeps.submit``).

Only the records that crash recovery relies on are fsynced (~1-4 ms each on this VM): the
copy of the sweep file, the git state and the scripts (sbatch hands Slurm its own copy) are
renamed into place without one. The directory is built under a hidden temporary name and
renamed into place with its commit point (``members.json``), so it appears complete or not
at all.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.app.gitinfo import git_state
from ddlaunch.runner import Runner
from ddlaunch.store import submission
from ddlaunch.store.rundir import RunDir, RunIdTaken, check_safe_name
from ddlaunch.store.snapshots import write_snapshot
from ddlaunch.store.sweeps import ARRAYS_DIR, MEMBERS_DIR, MEMBERS_FILE, SWEEP_FILE
from ddlaunch.sweeps.packing import packed_members
from ddlaunch.sweeps.prepare import PreparedSweep, Tick


def put(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic and durable (temporary name, fsync, rename, fsync of the directory): a file
    that crash recovery relies on. An fsync costs ~4 ms on this VM's disk."""
    fsutil.atomic_write_text(path, text, mode)


def put_json(path: Path, obj: Any) -> None:
    """``put`` of ``obj`` as compact JSON: json's C encoder (an indent forces the
    pure-Python one, ~1 ms for an array record's thousand members)."""
    put(path, json.dumps(obj, sort_keys=True) + "\n")


def put_informational(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic for readers (temporary name, rename), without an fsync: a file nothing
    depends on after a crash (the sweep file's copy, git state; an array's script, which
    sbatch copies to Slurm when it submits)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def member_dir(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / MEMBERS_DIR / str(index)


def create_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None = None
) -> Path:
    """The sweep directory: the sweep file, the arrays' scripts, the work tree's state and
    ``members.json`` (written last: until it exists the directory is not a sweep, see
    ``is_sweep_dir``). No member directory: each is created when the member first starts."""
    write_sweep_dir(prepared, runner, workdir, tick).finish()
    return prepared.sweep_dir


def write_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None
) -> GitProbe:
    """All a sweep writes before its first sbatch; returns the git probe, still running.

    The directory is built under a hidden temporary name and renamed into place with its
    commit point, so it appears complete or not at all (an interrupt leaves nothing). A
    thread creates it and writes the copies (file-system calls, which release the GIL)
    while this one serialises ``members.json`` (Python): the two overlap."""
    git = GitProbe(runner, workdir, prepared.sweep_dir)
    final = prepared.sweep_dir
    check_safe_name(final.name, "sweep id")
    if final.exists():
        git.finish()
        raise RunIdTaken(f"sweep directory {final} exists already")
    building = final.with_name(f".{final.name}.{os.urandom(4).hex()}.new")
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            creating = pool.submit(_create_dirs, prepared, building)
            text = packed_members(prepared)
            creating.result()
        _commit(prepared, building, text, tick)
        git.directory_created()
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        git.finish()
        raise
    return git


def _create_dirs(prepared: PreparedSweep, building: Path) -> None:
    """The sweep directory, under its temporary name, without its commit point. The arrays'
    scripts are written here: sbatch reads them (at their final paths, after the rename)."""
    sweep = RunDir.create(building.parent, building.name)
    (sweep.path / ARRAYS_DIR).mkdir()  # members/ comes with the first member's directory
    sweep_file = prepared.spec.path.read_text(encoding="utf-8")
    put_informational(sweep.path / SWEEP_FILE, sweep_file)
    for array in prepared.arrays:
        relative = Path(array.script_path).relative_to(prepared.sweep_dir)
        put_informational(sweep.path / relative, array.script, 0o700)
    if prepared.snapshot is not None:  # which code the members run (a resubmission too)
        write_snapshot(sweep.path, prepared.snapshot.record())


def _commit(prepared: PreparedSweep, building: Path, text: str, tick: Tick | None) -> None:
    """``members.json`` (``text``), durable, then the directory renamed into place: the
    commit point of the sweep directory. The array tasks read it, so it is durable before
    any sbatch runs."""
    put(building / MEMBERS_FILE, text)
    try:
        os.rename(building, prepared.sweep_dir)  # replaces nothing but an empty directory
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise RunIdTaken(f"sweep directory {prepared.sweep_dir} exists already") from None
        raise
    fsutil.fsync_dir(prepared.sweep_dir.parent)  # the sweep directory's own entry
    if tick:
        tick(len(prepared.members))


class GitProbe:
    """``git_state`` in a thread (one or two git commands, 5-25 ms), which writes
    ``git.json`` (and ``git.diff``) once the sweep directory exists: both run while the
    directory is written and the arrays are submitted."""

    def __init__(self, runner: Runner, workdir: str, sweep_dir: Path) -> None:
        self.workdir, self.sweep_dir = workdir, sweep_dir
        self.error: BaseException | None = None
        self._created = False
        self._decided = threading.Event()  # the directory exists, or never will
        self.thread = threading.Thread(target=self._run, args=(runner,), daemon=True)
        self.thread.start()

    def directory_created(self) -> None:
        self._created = True
        self._decided.set()

    def finish(self) -> None:
        """Wait for the probe; raise what writing its files raised."""
        self._decided.set()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self, runner: Runner) -> None:
        try:
            git = git_state(runner, self.workdir)
            self._decided.wait()
            if git is None or not self._created:
                return
            state = {
                "commit": git.commit,
                "branch": git.branch,
                "dirty": git.dirty,
                "workdir": self.workdir,
            }
            put_informational(
                self.sweep_dir / submission.GIT_FILE, json.dumps(state, indent=2) + "\n"
            )
            if git.diff:
                put_informational(self.sweep_dir / submission.GIT_DIFF_FILE, git.diff)
        except BaseException as exc:  # re-raised by finish, in the submitting thread
            self.error = exc
