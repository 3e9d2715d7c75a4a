"""Create a sweep directory and submit its arrays (the imperative shell of sweeps).

Cost model: a sweep of thousands must not pay per member in filesystem metadata operations
(a file or directory create: ~0.4 ms on this VM's ext4, milliseconds on Lustre or GPFS),
nor in fsyncs (~2-10 ms). So submitting writes O(1) files, each atomic and fsynced:

1. ``sweep.yaml`` and the arrays' scripts ``arrays/<n>.sbatch``, then ``members.json``
   (the sweep's axes and how each member's resolved config is made, config sections
   stored once; the arrays about to be submitted, state ``submitting``): the commit point
   (``is_sweep_dir``), durable before any sbatch;
2. per array, its sbatch, then its record ``arrays/<n>.json`` with the job id (or the
   error), durable. A crash in between leaves the intent naming the members an array may
   hold, never a member submitted without trace;
3. ``git.json`` (the work tree's state, probed meanwhile in a thread).

Only the records that crash recovery relies on are fsynced (~1-4 ms each on this VM): the
copy of the sweep file, the git state and the scripts (sbatch hands Slurm its own copy)
are renamed into place without one. A resubmission (members exist already) writes an
array's script and intent record before its sbatch: it does not rewrite ``members.json``.

Members' run directories and their submitit pickles are created when each member first
starts (``ddlaunch.store.sweeps``), from these records. A resubmission concerns members
that usually exist already; it creates those that do not, and updates each member's own
records as ``ddlaunch resume`` does for a run.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlaunch import fsutil
from ddlaunch.app.gitinfo import git_state
from ddlaunch.config.errors import ConfigError
from ddlaunch.config.load import LoadedTree, apply_overrides
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.planning.plan import ClusterFacts, CodePaths
from ddlaunch.runner import Runner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import submission
from ddlaunch.store.failures import FAILURES_DIR
from ddlaunch.store.members import materialize, member_config_text
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.rundir import CONFIG_FILE, RunDir, archive
from ddlaunch.store.snapshots import read_snapshot, write_snapshot
from ddlaunch.store.sweeps import (
    ARRAYS_DIR,
    MEMBERS_DIR,
    MEMBERS_FILE,
    SWEEP_FILE,
    array_records,
    member_overrides,
    read_members,
)
from ddlaunch.sweeps.packing import SectionCache, array_intent, config_text, packed_members
from ddlaunch.sweeps.prepare import (
    ArrayJob,
    PreparedSweep,
    SweepMembersError,
    Tick,
    plan_arrays,
)
from ddlaunch.sweeps.spec import Member

# Arrays submitted at once: a split sweep then costs about one sbatch round trip, not one
# per array, without flooding slurmctld.
PARALLEL_SBATCH = 8


@dataclass(frozen=True)
class ArrayOutcome:
    name: str
    members: tuple[int, ...]
    job_id: str | None
    error: str | None = None


# ----------------------------------------------------------------------------- files


def _put(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic and durable (temporary name, fsync, rename, fsync of the directory): a file
    that crash recovery relies on. An fsync costs ~4 ms on this VM's disk."""
    fsutil.atomic_write_text(path, text, mode)


def _put_json(path: Path, obj: Any) -> None:
    """``_put`` of ``obj`` as compact JSON: json's C encoder (an indent forces the
    pure-Python one, ~1 ms for an array record's thousand members)."""
    _put(path, json.dumps(obj, sort_keys=True) + "\n")


def _put_informational(path: Path, text: str, mode: int = 0o600) -> None:
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


# ----------------------------------------------------------------------------- create


def create_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None = None
) -> Path:
    """The sweep directory: the sweep file, the arrays' scripts, the work tree's state and
    ``members.json`` (written last: until it exists the directory is not a sweep, see
    ``is_sweep_dir``). No member directory: each is created when the member first starts."""
    _write_sweep_dir(prepared, runner, workdir, tick).finish()
    return prepared.sweep_dir


def _write_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None
) -> _GitProbe:
    """All a sweep writes before its first sbatch; returns the git probe, still running.

    A thread creates the directory and writes the copies (file-system calls, which release
    the GIL) while this one serialises ``members.json`` (Python): the two overlap."""
    git = _GitProbe(runner, workdir, prepared.sweep_dir)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            creating = pool.submit(_create_dirs, prepared)
            text = packed_members(prepared)
            creating.result()
        git.directory_created()
        _commit(prepared, text, tick)
    except BaseException:
        git.finish()
        raise
    return git


def _create_dirs(prepared: PreparedSweep) -> None:
    """The sweep directory without its commit point: not a sweep yet (``is_sweep_dir``).
    The arrays' scripts are written here: sbatch reads them."""
    sweep = RunDir.create(prepared.sweep_dir.parent, prepared.sweep_id)
    assert sweep.path == prepared.sweep_dir
    (sweep.path / ARRAYS_DIR).mkdir()  # members/ comes with the first member's directory
    sweep_file = prepared.spec.path.read_text(encoding="utf-8")
    _put_informational(sweep.path / SWEEP_FILE, sweep_file)
    for array in prepared.arrays:
        _put_informational(Path(array.script_path), array.script, 0o700)
    if prepared.snapshot is not None:  # which code the members run (a resubmission too)
        write_snapshot(sweep.path, prepared.snapshot.record())


def _commit(prepared: PreparedSweep, text: str, tick: Tick | None) -> None:
    """``members.json`` (``text``), durable: the commit point of the sweep directory. The
    array tasks read it, so it is durable before any sbatch runs."""
    _put(prepared.sweep_dir / MEMBERS_FILE, text)
    fsutil.fsync_dir(prepared.sweep_dir.parent)  # the sweep directory's own entry
    if tick:
        tick(len(prepared.members))


class _GitProbe:
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
            _put_informational(
                self.sweep_dir / submission.GIT_FILE, json.dumps(state, indent=2) + "\n"
            )
            if git.diff:
                _put_informational(self.sweep_dir / submission.GIT_DIFF_FILE, git.diff)
        except BaseException as exc:  # re-raised by finish, in the submitting thread
            self.error = exc


# ----------------------------------------------------------------------------- submit


def _submit_one(
    sweep_dir: Path, array: ArrayJob, client: SlurmClient, sources: Sequence[str], existing: bool
) -> ArrayOutcome:
    """One array: sbatch, then its record with the job id (or the error), durable.
    ``existing``: a resubmission, whose members have run directories with their own
    records, which follow the array's; its script and intent record are written first. A
    new sweep's are in its directory already (its intents in ``members.json``)."""
    spec, plan = array.spec, array.plan
    record_path = sweep_dir / ARRAYS_DIR / f"{spec.name}.json"
    record = array_intent(array, time.time())
    if existing:  # a crash after sbatch leaves the members the array may hold
        _put_informational(Path(array.script_path), array.script, 0o700)
        _put_json(record_path, record)
    try:
        job_id = client.sbatch(plan.sbatch_argv)
    except Exception as exc:  # recorded for every member; the other arrays still go
        _put_json(record_path, {**record, "state": "failed", "error": str(exc)})
        if existing:
            for member in spec.members:
                _record_member(sweep_dir, member, array, sources, None, str(exc))
        return ArrayOutcome(spec.name, spec.members, None, str(exc))
    _put_json(record_path, {**record, "state": "submitted", "job_id": job_id})
    if existing:
        for task, member in enumerate(spec.members):
            _record_member(sweep_dir, member, array, sources, f"{job_id}_{task}", None)
    return ArrayOutcome(spec.name, spec.members, job_id)


def _record_member(
    sweep_dir: Path,
    index: int,
    array: ArrayJob,
    sources: Sequence[str],
    job_id: str | None,
    error: str | None,
) -> None:
    """An existing member directory's job id (status, logs, cancel and resume see a run),
    or why it has none. The task adds its id itself when it starts first."""
    run = member_dir(sweep_dir, index)
    try:
        previous = submission.read_submission(run)
    except ValueError:  # torn by a crash: the arrays' records still have the ids
        previous = {}
    job_ids = list(previous.get("job_ids", []))
    # A member's script is its array's: one file for hundreds of members.
    about = {"sweep_id": array.spec.sweep_id, "array": array.spec.name, "script": array.script_path}
    if job_id is None:
        intent = {
            "run_id": str(index),
            **about,
            "created": time.time(),
            "submit_host": socket.gethostname(),
            "sbatch_argv": list(array.plan.sbatch_argv),
            "sources": list(sources),
            "previous_job_ids": job_ids,
            "state": "failed",
            "error": error,
        }
        _put_json(run / submission.INTENT_FILE, intent)
        return
    ids = job_ids if job_id in job_ids else [*job_ids, job_id]
    _put_json(run / submission.SUBMISSION_FILE, {"job_ids": ids, "submitted": time.time(), **about})


def submit_arrays(
    sweep_dir: Path,
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    client: SlurmClient,
    tick: Tick | None = None,
    existing: bool = False,
) -> list[ArrayOutcome]:
    """Submit every array (a few at once); a failed sbatch fails only its own members.
    ``existing``: the members' run directories exist (a resubmission)."""

    def one(array: ArrayJob) -> ArrayOutcome:
        outcome = _submit_one(sweep_dir, array, client, sources, existing)
        if tick:
            tick(len(outcome.members))
        return outcome

    if len(arrays) == 1:  # the common case: no thread
        return [one(arrays[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_SBATCH, len(arrays)))) as pool:
        return list(pool.map(one, arrays))


def submit_sweep(
    prepared: PreparedSweep,
    *,
    workdir: str,
    client: SlurmClient,
    tick_create: Tick | None = None,
    tick_submit: Tick | None = None,
) -> list[ArrayOutcome]:
    """Create the sweep directory and submit its arrays: ``members.json``, the commit point
    with the arrays' intents, is durable before the first sbatch; each array's record with
    its job id after its sbatch. Two fsync latencies in all (~1-4 ms each here, more on a
    shared filesystem). The git state is probed meanwhile."""
    git = _write_sweep_dir(prepared, client.runner, workdir, tick_create)
    try:
        return submit_arrays(
            prepared.sweep_dir, prepared.arrays, prepared.sources, client, tick_submit
        )
    finally:
        git.finish()


# ----------------------------------------------------------------------------- resubmit


def load_member_configs(
    sweep_dir: Path, indices: Sequence[int], overrides: Sequence[str] = ()
) -> list[Config]:
    """Members' resolved configs (plus ``overrides``), validated; all problems at once.
    A member that never started has its config in ``members.json`` only."""
    recorded = member_overrides(read_members(sweep_dir))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    configs: list[Config] = []
    bad: list[tuple[Member, ConfigError]] = []
    for index in indices:
        text, source = member_config_text(sweep_dir, index)
        # Written by ddlaunch from a validated config: plain YAML, no line marks needed
        # (errors of --set name the --set).
        tree = yaml.load(text, Loader=loader) or {}
        loaded = LoadedTree(tree=tree, locations={}, sources=[source])
        try:
            apply_overrides(loaded, overrides)
            configs.append(validate_tree(loaded))
        except ConfigError as exc:
            texts = recorded[index] if 0 <= index < len(recorded) else []
            bad.append((Member.from_texts(index, texts), exc))
    if bad:
        raise SweepMembersError(bad, len(indices))
    return configs


def next_array_name(sweep_dir: Path) -> int:
    """A name no array of the sweep has: not among the records, nor the intents of arrays
    whose record a crash may have left unwritten."""
    names = [str(r.get("name")) for r in array_records(sweep_dir)]
    return max((int(n) for n in names if n.isdigit()), default=-1) + 1


def plan_resubmission(
    sweep_dir: Path,
    indices: Sequence[int],
    *,
    workdir: str,
    facts: ClusterFacts,
    overrides: Sequence[str] = (),
    hold: bool = False,
) -> tuple[list[Config], list[ArrayJob], tuple[str, ...]]:
    meta = read_members(sweep_dir)
    configs = load_member_configs(sweep_dir, indices, overrides)
    sources: tuple[str, ...] = (f"resubmission in sweep {meta['sweep_id']}",)
    if overrides:
        sources += (f"--set ({len(overrides)})",)
    snap = read_snapshot(sweep_dir) or {}
    code = None
    if snap.get("path") and Path(snap["path"]).is_dir():  # the sweep's code, as resume keeps
        code = CodePaths(snapshot=snap["path"], workdir=snap.get("workdir") or snap["path"])
    arrays = plan_arrays(
        list(zip(indices, configs, strict=True)),
        sweep_id=meta["sweep_id"],
        sweep_dir=sweep_dir,
        workdir=workdir,
        sources=sources,
        facts=facts,
        throttle=meta.get("throttle"),
        first_name=next_array_name(sweep_dir),
        hold=hold,
        code=code,
    )
    return configs, arrays, sources


def resubmit_members(
    sweep_dir: Path,
    indices: Sequence[int],
    configs: Sequence[Config],
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    client: SlurmClient,
    tick: Tick | None = None,
) -> list[ArrayOutcome]:
    """Like ``ddlaunch resume`` for each member: the previous config and failure records go
    to ``history/``, the stale end records are removed, and the job restores the member's
    latest complete checkpoint (its own directory)."""
    cache: SectionCache = {}
    for index, cfg in zip(indices, configs, strict=True):
        # A member that never started (its array was refused or cancelled while pending)
        # gets its directory now: its records follow the new array from here on.
        run = materialize(sweep_dir, index)
        archive(
            run,
            copy=(CONFIG_FILE,),
            move=(FAILURES_DIR,),
            remove=(OUTCOME_FILE, CANCEL_FILE, submission.INTENT_FILE),
        )
        _put(run / CONFIG_FILE, config_text(cfg, cache))
    return submit_arrays(sweep_dir, arrays, sources, client, tick, existing=True)


def outcome_lines(outcomes: Sequence[ArrayOutcome]) -> list[str]:
    lines = []
    for o in outcomes:
        span = f"members {_span(o.members)}"
        if o.job_id:
            lines.append(f"array {o.name}: job {o.job_id} ({len(o.members)} tasks, {span})")
        else:
            lines.append(f"array {o.name}: sbatch FAILED for {span}: {o.error}")
    return lines


def _span(indices: Sequence[int]) -> str:
    """``0-100`` for a consecutive run, else the first few."""
    if list(indices) == list(range(indices[0], indices[0] + len(indices))):
        return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    head = ",".join(map(str, indices[:6]))
    return head + (",..." if len(indices) > 6 else "")
