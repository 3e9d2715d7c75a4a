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

import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from ddlaunch.app import interrupts
from ddlaunch.app.prepare import ListedNodes
from ddlaunch.config.errors import ConfigError
from ddlaunch.config.load import LoadedTree, apply_overrides
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import ClusterFacts, CodePaths
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import records, submission
from ddlaunch.store.failures import FAILURES_DIR
from ddlaunch.store.members import materialize, member_config_text
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE, write_cancel
from ddlaunch.store.rundir import CONFIG_FILE, archive
from ddlaunch.store.snapshots import read_snapshot
from ddlaunch.store.sweeps import (
    ARRAYS_DIR,
    ArrayRecord,
    array_records,
    member_overrides,
    read_members,
)
from ddlaunch.sweeps.directory import create_sweep_dir as create_sweep_dir
from ddlaunch.sweeps.directory import (
    member_dir,
    put,
    put_informational,
    put_json,
    write_sweep_dir,
)
from ddlaunch.sweeps.packing import SectionCache, array_intent, config_text
from ddlaunch.sweeps.prepare import (
    ArrayJob,
    PreparedSweep,
    SweepMembersError,
    Tick,
    plan_arrays,
)
from ddlaunch.sweeps.spec import Member
from ddlaunch.wording import counted

# Arrays submitted at once: a split sweep then costs about one sbatch round trip, not one
# per array, without flooding slurmctld.
PARALLEL_SBATCH = 8


@dataclass(frozen=True)
class ArrayOutcome:
    name: str
    members: tuple[int, ...]
    job_id: str | None
    error: str | None = None


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
        put_informational(Path(array.script_path), array.script, 0o700)
        put_json(record_path, record.to_json())
    try:
        job_id = client.sbatch(plan.sbatch_argv)
    except Exception as exc:  # recorded for every member; the other arrays still go
        put_json(record_path, record.updated(state="failed", error=str(exc)).to_json())
        if existing:
            for member in spec.members:
                _record_member(sweep_dir, member, array, sources, None, str(exc))
        return ArrayOutcome(spec.name, spec.members, None, str(exc))
    put_json(record_path, record.updated(state="submitted", job_id=job_id).to_json())
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
    # Torn by a crash, it reads as empty: the arrays' records still have the ids.
    job_ids = list(submission.read_submission(run).job_ids or ())
    # A member's script is its array's: one file for hundreds of members.
    about = {"sweep_id": array.spec.sweep_id, "array": array.spec.name, "script": array.script_path}
    if job_id is None:
        # from_json: an error not known is recorded as null
        intent = submission.Intent.from_json(
            {
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
        )
        put_json(run / submission.INTENT_FILE, intent.to_json())
        return
    ids = job_ids if job_id in job_ids else [*job_ids, job_id]
    record = submission.Submission(job_ids=tuple(ids), submitted=time.time(), extra=about)
    put_json(run / submission.SUBMISSION_FILE, record.to_json())


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
    git = write_sweep_dir(prepared, client.runner, workdir, tick_create)
    try:
        return _submit_or_withdraw(
            prepared.sweep_dir, prepared.arrays, prepared.sources, client, tick_submit, False
        )
    finally:
        git.finish()


def _submit_or_withdraw(
    sweep_dir: Path,
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    client: SlurmClient,
    tick: Tick | None,
    existing: bool,
) -> list[ArrayOutcome]:
    """``submit_arrays`` with SIGINT/SIGTERM held until every array's record holds its job
    id; then the interrupt cancels the arrays just submitted, and their records say so."""
    outcomes: list[ArrayOutcome] = []
    try:
        with interrupts.deferred():
            outcomes = submit_arrays(sweep_dir, arrays, sources, client, tick, existing)
    except KeyboardInterrupt as exc:
        with interrupts.deferred():
            _withdraw(sweep_dir, outcomes, client, exc, existing)
        raise
    return outcomes


def _withdraw(
    sweep_dir: Path,
    outcomes: Sequence[ArrayOutcome],
    client: SlurmClient,
    exc: KeyboardInterrupt,
    existing: bool,
) -> None:
    submitted = [o for o in outcomes if o.job_id]
    if not submitted:
        exc.add_note("no array was submitted")
        return
    ids = [str(o.job_id) for o in submitted]
    try:
        client.cancel(ids)
    except UserError as error:
        exc.add_note(
            f"arrays {', '.join(ids)} were submitted and could not be cancelled ({error}); "
            f"they are recorded in {sweep_dir}"
        )
        return
    why = f"interrupted by {interrupts.signal_name(exc)} during the submission; cancelled"
    for o in submitted:
        path = sweep_dir / ARRAYS_DIR / f"{o.name}.json"
        found, _ = records.load_json(path, dict, {})
        put_json(path, ArrayRecord.from_json(found).updated(state="cancelled", error=why).to_json())
        for task, member in enumerate(o.members if existing else ()):
            write_cancel(member_dir(sweep_dir, member), [f"{o.job_id}_{task}"])
    exc.add_note(f"arrays {', '.join(ids)} were cancelled; {sweep_dir.name} records it")


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
    names = [str(r.name) for r in array_records(sweep_dir)]
    return max((int(n) for n in names if n.isdigit()), default=-1) + 1


def free_slots(throttle: int | None, busy: int) -> int | None:
    """The sweep's throttle less the members that hold a slot now (at least one)."""
    return None if throttle is None else max(1, throttle - busy)


def plan_resubmission(
    sweep_dir: Path,
    indices: Sequence[int],
    *,
    workdir: str,
    facts: ClusterFacts,
    overrides: Sequence[str] = (),
    hold: bool = False,
    busy: int = 0,
    listed: ListedNodes | None = None,
) -> tuple[list[Config], list[ArrayJob], tuple[str, ...]]:
    """The arrays that submit ``indices`` again. ``busy``: members of the sweep still queued
    or running in its other arrays: they hold that many of the sweep's ``throttle`` slots,
    so the new arrays share what is left (at least one). ``listed``: my bad-node list, kept
    out of the new arrays (``plan_arrays``)."""
    meta = read_members(sweep_dir)
    configs = load_member_configs(sweep_dir, indices, overrides)
    sources: tuple[str, ...] = (f"resubmission in sweep {meta['sweep_id']}",)
    if overrides:
        sources += (f"--set ({len(overrides)})",)
    snap = read_snapshot(sweep_dir)
    code = None
    if snap is not None and snap.path and Path(snap.path).is_dir():  # the sweep's, as resume keeps
        code = CodePaths(snapshot=snap.path, workdir=snap.workdir or snap.path)
    arrays = plan_arrays(
        list(zip(indices, configs, strict=True)),
        sweep_id=meta["sweep_id"],
        sweep_dir=sweep_dir,
        workdir=workdir,
        sources=sources,
        facts=facts,
        throttle=free_slots(meta.get("throttle"), busy),
        # The sweep file's name: (a sweep written before it was recorded: the members' own).
        job_name=meta.get("name"),
        first_name=next_array_name(sweep_dir),
        hold=hold,
        code=code,
        listed=listed,
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
    latest complete checkpoint (its own directory). An interrupt waits until every chosen
    member's records are rewritten: none is left half way."""
    cache: SectionCache = {}
    with interrupts.deferred():
        for index, cfg in zip(indices, configs, strict=True):
            # A member that never started (its array was refused or cancelled while
            # pending) gets its directory now: its records follow the new array from here.
            run = materialize(sweep_dir, index)
            archive(
                run,
                copy=(CONFIG_FILE,),
                move=(FAILURES_DIR,),
                remove=(OUTCOME_FILE, CANCEL_FILE, submission.INTENT_FILE),
            )
            put(run / CONFIG_FILE, config_text(cfg, cache))
    return _submit_or_withdraw(sweep_dir, arrays, sources, client, tick, True)


def outcome_lines(outcomes: Sequence[ArrayOutcome]) -> list[str]:
    lines = []
    for o in outcomes:
        span = f"members {_span(o.members)}"
        if o.job_id:
            lines.append(
                f"array {o.name}: job {o.job_id} ({counted(len(o.members), 'task')}, {span})"
            )
        else:
            lines.append(f"array {o.name}: sbatch FAILED for {span}: {o.error}")
    return lines


def _span(indices: Sequence[int]) -> str:
    """``0-100`` for a consecutive run, else the first few."""
    if list(indices) == list(range(indices[0], indices[0] + len(indices))):
        return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    head = ",".join(map(str, indices[:6]))
    return head + (",..." if len(indices) > 6 else "")
