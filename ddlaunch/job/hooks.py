"""Hooks the batch script runs around srun: ``python -m ddlaunch.job.hooks start|end``.

``start`` opens an attempt record (nodes, the step it resumes from) and, if the previous
attempt never closed (Slurm requeued the job after a node failure, or the batch host died),
closes that one and blames the nodes Slurm now reports as bad. ``end`` works out how the
attempt ended (completed, also when srun's status is that of a rank an in-process restart
replaced; cancelled, a failed preflight, a crash, a node failure, the watchdog's hang or
straggler verdict) and concludes it (``ddlaunch.conclude``): requeue the job (excluding
blamed nodes), restart the ranks inside the allocation (the exit code
``RESTART_EXIT``: the batch script then starts a new srun step, with ``$DDLAUNCH_RELAUNCH``
one higher, and ``start`` opens its attempt) or record the final outcome. A job with hot
spares or ``nodes.min`` also runs ``place`` (the next step's nodes, ``job.placement``),
``spares`` (the spares' preflight) and ``guard`` (the batch host's guard, ``job.guard``).
Torch-free: it runs on the batch host in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ddlaunch.checkpoint import adapters
from ddlaunch.conclude import Conclusion, cancel_reason, conclude
from ddlaunch.config.fault_tolerance import FaultToleranceSpec, can_leave_out
from ddlaunch.config.health import HealthSpec
from ddlaunch.config.schema import Config, StorageSpec
from ddlaunch.config.trainers import is_byo
from ddlaunch.config.validate import load_config
from ddlaunch.job import stop as stopping
from ddlaunch.job.adoption import adopt
from ddlaunch.job.attribution import batch_log, log_size
from ddlaunch.job.blame import bad_nodes, expand
from ddlaunch.job.endings import Blame, failed_ending, finished_in_process
from ddlaunch.job.guard import exec_guard
from ddlaunch.job.placement import (
    next_placement,
    placement_fields,
    print_placement,
    step_nodelist,
)
from ddlaunch.job.preflight import (
    RESTART_EXIT,
    InAllocation,
    check_spares,
    preflight_outcome,
)
from ddlaunch.job.sweep_task import start_task
from ddlaunch.policy import requeue as policy
from ddlaunch.policy.requeue import Ending, RetryBudget
from ddlaunch.slurm.client import Requeuer, SlurmClient
from ddlaunch.store import attempts, exclusions, outcome, signal_save, stops
from ddlaunch.store.attempts import AttemptId, AttemptRecord
from ddlaunch.store.rundir import (
    CheckpointSource,
    checkpoint_source,
    config_path,
    latest_checkpoint,
    read_config_tree,
)

# The schema's own defaults, for a run whose config cannot be read.
_FT, _HEALTH, _STORAGE = FaultToleranceSpec(), HealthSpec(), StorageSpec()


@dataclass(frozen=True)
class HookSettings:
    """The few config values the hooks need (``from_config``); the defaults are the
    schema's."""

    max_requeues: int = _FT.max_requeues
    max_restarts: int = _FT.max_restarts
    ranks_per_node: int = 1
    bad_node_ttl_hours: float = _HEALTH.bad_node_ttl_hours
    signal_lead: int = _FT.signal_lead
    nodes: int = 1  # nodes.count: the ranks' nodes
    min_nodes: int | None = None  # nodes.min
    spare_nodes: int = _FT.spare_nodes
    ranks_listed: int = _STORAGE.ranks_listed

    @property
    def elastic(self) -> bool:
        """A failed node can be left out inside the allocation (Config.elastic)."""
        return can_leave_out(self.nodes, self.min_nodes, self.spare_nodes)

    @property
    def requeues_only(self) -> RetryBudget:
        """The budget of a conclusion that cannot restart in the allocation (after a save on
        the signal: the time is up; in a pod: Kubernetes restarts it)."""
        return RetryBudget(self.max_requeues)

    @classmethod
    def from_config(cls, cfg: Config) -> HookSettings:
        ft = cfg.fault_tolerance
        return cls(
            max_requeues=ft.max_requeues,
            max_restarts=ft.max_restarts,
            ranks_per_node=cfg.ranks_per_node,
            bad_node_ttl_hours=cfg.health.bad_node_ttl_hours,
            signal_lead=ft.signal_lead,
            nodes=cfg.nodes.count,
            min_nodes=cfg.nodes.min,
            spare_nodes=ft.spare_nodes,
            ranks_listed=cfg.storage.ranks_listed,
        )

    @classmethod
    def of_run(cls, run_dir: Path) -> HookSettings:
        """The run's settings, read as every batch-host hook reads the run's config
        (``load_config``: validated, with the schema's defaults); the defaults, with a
        warning in the batch log, when it cannot be read: an unreadable config must not cost
        the attempt its record."""
        try:
            return cls.from_config(load_config(config_path(run_dir)))
        except Exception as exc:
            print(f"[ddlaunch] warning: {config_path(run_dir)}: {exc}; defaults used", flush=True)
            return cls()


# Endings after which the newest checkpoint of a layout without a completeness marker is
# trusted: the trainer exited by itself.
_CLEAN = (policy.CAUSE_COMPLETED, policy.CAUSE_SIGNAL)


def _close_cut_off(
    run_dir: Path,
    record: AttemptRecord,
    client: SlurmClient,
    step: int | None,
    settings: HookSettings,
    job_id: str = "",
) -> AttemptRecord:
    """The previous attempt never reached ``end``: Slurm requeued it (a node failure, a
    preemption), or the trainer did after ddlaunch asked it to stop (Lightning's own
    ``scontrol requeue`` ends the batch shell too), or, when it ran as another job than this
    one (``job_id``), that job ended without its end hook and the run went on here
    (``resume``): Slurm's accounting says how it ended."""
    asked = stops.read_stop_of(run_dir, record)
    prev_nodes = expand(record.nodes or "")
    states = client.node_states(prev_nodes) if prev_nodes else {}
    # The watchdog saw them die (slurmd refused) even if Slurm has them back by now.
    dead = list(record.dead_nodes or ())
    blamed = sorted(set(bad_nodes(states)) | set(dead))
    cause = policy.CAUSE_TRAINER_STOP if asked and not blamed else policy.CAUSE_REQUEUED_BY_SLURM
    extra: dict[str, object] = {"node_states": states}
    other_job = bool(record.job_id and job_id and record.job_id != job_id)
    if other_job and not asked:
        cause = policy.CAUSE_JOB_ENDED
        row = client.accounting_rows([str(record.job_id)]).get(str(record.job_id))
        how = f"ended {row.state}" if row is not None and row.state else "ended"
        extra["culprit"] = (
            f"job {record.job_id} {how} before its end hook ran; the run went on as job {job_id}"
        )
    if asked:
        extra.update(signal=asked.signal, stop=asked.why)
        extra["decision"] = "requeued by Slurm (the trainer's own scontrol requeue)"
    elif record.guard:
        extra["decision"] = record.guard  # the batch host died (job.guard)
    closed = attempts.close(record, cause=cause, committed_step=step, blamed=blamed, **extra)
    if blamed:
        said = {n: record.dead_why or "died" for n in dead}
        why = "node failure: " + ", ".join(f"{n} {states.get(n) or said[n]}" for n in blamed)
        # A node Slurm declared down is evidence about the node: my later jobs avoid it.
        exclusions.leave_out(run_dir, blamed, why, settings.bad_node_ttl_hours)
    return closed


def unclean_end(previous: AttemptRecord | None) -> float | None:
    """When the previous attempt ended uncleanly (None: it did not): its end as the end hook
    saw it, or infinity when it was cut off before the end hook (time unknown)."""
    if previous is None or previous.cause in _CLEAN or previous.exit_code == 0:
        return None
    if previous.exit_code is None:
        return float("inf")
    return float(previous.end or float("inf"))


def prepare_restart(
    run_dir: Path, source: CheckpointSource, previous: AttemptRecord | None, tag: str
) -> list[Path]:
    """Before the trainer restarts: move partial checkpoints it might pick up out of its
    directory (never deleted). For layouts without a completeness marker the newest one is
    suspect when the previous attempt did not end cleanly."""
    doomed = adapters.to_move_aside(source.root, source.layout, unclean_end=unclean_end(previous))
    moved = adapters.move_aside(source.root, doomed, tag)
    for entry, target in zip(doomed, moved, strict=False):
        why = entry.reason or "the newest, and the attempt did not end cleanly"
        print(f"[ddlaunch] moved partial checkpoint {entry.name} ({why}) to {target}", flush=True)
    return moved


def start(
    run_dir: Path,
    client: SlurmClient,
    attempt: AttemptId,
    env: Mapping[str, str],
    settings: HookSettings = HookSettings(),
) -> None:
    # Where this attempt's part of the batch log begins (before this hook's own lines): the
    # end hook reads srun's reports from there, however many tasks there are.
    log_offset = log_size(batch_log(run_dir, attempt))
    records = attempts.load(run_dir)
    source = checkpoint_source(run_dir)
    if records and records[-1].is_open:
        found = latest_checkpoint(run_dir, source)
        step = found.step if found else None
        records[-1] = _close_cut_off(
            run_dir, records[-1], client, step, settings, job_id=attempt.job_id
        )
    if is_byo(source.kind):
        prepare_restart(run_dir, source, records[-1] if records else None, attempt.key)
    found = latest_checkpoint(run_dir, source)
    step = found.step if found else None
    nodes = step_nodelist(env)
    record = attempts.new_record(
        len(records), attempt, nodes=nodes, host=os.uname().nodename, resumed_from=step
    )
    if log_offset is not None:
        record = record.updated(log_offset=log_offset)
    if settings.elastic:
        wanted, fewest, per_node = settings.nodes, settings.min_nodes, settings.ranks_per_node
        record = record.updated(**placement_fields(run_dir, env, nodes, wanted, fewest, per_node))
    again = ""
    if attempt.relaunch and records:
        # The batch script restarted the ranks in the allocation after the previous attempt.
        record = record.updated(restart_cause=records[-1].cause)
        again = f" (restart {attempt.relaunch} in the allocation after {record.restart_cause})"
    if is_byo(source.kind):
        # The ranks take the checkpoint from here, so all of them resume from the same one.
        record = record.updated(resume_checkpoint=str(found.path) if found else None)
    records.append(record)
    attempts.save(run_dir, records)
    origin = f"step {step}" if step is not None else "scratch"
    if found is not None and is_byo(source.kind):
        origin += f" ({found.path})"
    if record.shrunk:
        again += f" (shrunk: {record.shrunk})"
    print(
        f"[ddlaunch] attempt {len(records) - 1} on {nodes}{again}, resuming from {origin}",
        flush=True,
    )


def replaceable(
    run_dir: Path, env: Mapping[str, str], client: SlurmClient, settings: HookSettings
) -> bool:
    """Whether the next step can leave the run's excluded nodes out inside the allocation:
    a job with spares or nodes.min that has usable nodes enough left."""
    if not settings.elastic:
        return False
    found, _ = next_placement(run_dir, env, client, settings.nodes, settings.min_nodes)
    return found is not None


def may_restart(
    ending: Ending, client: SlurmClient, attempt: AttemptId, spare: bool = False
) -> bool:
    """Whether a restart in the allocation can work: an ending the restart rule allows
    (``policy.restartable``; with blamed nodes only where ``spare``: the allocation has nodes
    enough without them), a controller that answers (srun needs it for the new step; without
    it the run would stop for want of progress, where a requeue is retried until Slurm is
    back) and the job still in the start this attempt began in (nobody requeued it
    meanwhile)."""
    if not policy.restartable(ending.cause, ending.blamed, spare):
        return False
    return same_start(client, attempt)


def same_start(client: SlurmClient, attempt: AttemptId) -> bool:
    try:
        return bool(client.restarts(attempt.task) == attempt.restart)
    except Exception:  # unreachable, or an answer we cannot read: requeue as before
        return False


def conclude_signal_save(
    run_dir: Path,
    saved: signal_save.SignalSave,
    attempt: AttemptId,
    settings: HookSettings,
    client: Requeuer,
    exit_code: int,
) -> Conclusion:
    """The ranks (in a container) saved on the signal and left the conclusion to the host
    (the end hook here, the leader pod on Kubernetes): conclude as rank 0 would have."""
    step = saved.step
    assert step is not None  # signal_save.read gives none without it
    record = {"signal": saved.reason, "exit_code": exit_code}
    ending = Ending(policy.CAUSE_SIGNAL, step, record=record, saved_step=step)
    return conclude(run_dir, ending, settings.requeues_only, client, job=attempt.task)


def end(
    run_dir: Path,
    exit_code: int,
    client: SlurmClient,
    attempt: AttemptId,
    settings: HookSettings = HookSettings(),
    can_restart: bool = False,
    env: Mapping[str, str] = os.environ,
) -> int:
    """Close the attempt; requeue, restart in the allocation (``can_restart``: the script
    loops on ``RESTART_EXIT``) or record the outcome. Returns the script's exit code."""
    if can_restart and exit_code == RESTART_EXIT:
        exit_code = 1  # a rank's own 75 must not read as "restart" to the script
    records = attempts.load(run_dir)
    if not records:
        return exit_code
    current = records[-1]
    if not current.is_open:
        # Closed by rank 0 already: it saved on the signal and requeued the job itself, or
        # it stopped the run (a checkpoint save failed): Slurm's state should say which.
        ended = outcome.read_outcome(run_dir)
        return 1 if ended is not None and ended.state == policy.FAILED else 0
    saved = signal_save.read(run_dir, attempt)
    if saved is not None:
        conclusion = conclude_signal_save(run_dir, saved, attempt, settings, client, exit_code)
        return 0 if conclusion.requeued else exit_code
    nodes = expand(current.nodes or "")
    source = checkpoint_source(run_dir)
    asked = stops.read_stop(run_dir, attempt) if is_byo(source.kind) else None
    if cancel_reason(run_dir) is not None:
        ending = Ending(policy.CAUSE_CANCELLED)
    elif asked is not None:
        # ddlaunch asked the trainer to stop: requeue whatever its exit code, if it advanced.
        stop_record = {"signal": asked.signal, "stop": asked.why}
        ending = Ending(policy.CAUSE_TRAINER_STOP, record=stop_record)
    else:
        # A node failed the preflight inside the ranks (or the ranks ended before its
        # verdict): exclude it and requeue, or stop, before anything else is blamed.
        inside = None
        if can_restart and settings.elastic:
            inside = InAllocation(
                settings.max_restarts,
                lambda: replaceable(run_dir, env, client, settings) and same_start(client, attempt),
            )
        code = preflight_outcome(run_dir, client, attempt, nodes, exit_code != 0, inside)
        if code is not None:
            return code
        if exit_code == 0:
            ending = Ending(policy.CAUSE_COMPLETED)
        elif (finished := finished_in_process(current, exit_code)) is not None:
            ending = finished
        else:
            index = current.attempt if current.attempt is not None else len(records) - 1
            blame = Blame(
                settings.ranks_per_node, settings.bad_node_ttl_hours, settings.ranks_listed
            )
            ending = failed_ending(run_dir, nodes, attempt, index, client, blame)
    found = latest_checkpoint(run_dir, source)
    ending = replace(
        ending,
        committed_step=found.step if found else None,
        record={"exit_code": exit_code, **ending.record},
    )
    spare = can_restart and bool(ending.blamed) and replaceable(run_dir, env, client, settings)
    restarts = can_restart and may_restart(ending, client, attempt, spare)
    budget = RetryBudget(settings.max_requeues, settings.max_restarts if restarts else 0, spare)
    conclusion = conclude(
        run_dir,
        ending,
        budget,
        client,
        job=attempt.task,
        # A trainer may have requeued the job itself (Lightning): not a second time.
        restart=attempt.restart if is_byo(source.kind) else None,
    )
    if conclusion.restart:
        return RESTART_EXIT
    # A completed run's script exits 0 whatever srun said (a replaced rank's status): Slurm's
    # state, and the --after RUN:ok of runs submitted after it, then say it completed.
    completed = ending.cause == policy.CAUSE_COMPLETED
    return 0 if conclusion.requeued or completed else exit_code


def conclude_saved(
    run_dir: Path,
    client: SlurmClient,
    attempt: AttemptId,
    settings: HookSettings,
    stop: stops.Stop,
) -> None:
    """The trainer completed its save on ddlaunch's signal: conclude the attempt now (requeue,
    or record why not), without waiting for the trainer to exit; the end hook then finds it
    closed."""
    step = stop.saved_step
    record = {"signal": stop.signal, "stop": stop.why}
    ending = Ending(policy.CAUSE_TRAINER_STOP, step, record=record, saved_step=step)
    budget = settings.requeues_only
    conclude(run_dir, ending, budget, client, job=attempt.task, restart=attempt.restart)


def stop_reason(deadline: float | None, now: float, lead: int) -> str:
    """What the stop hook says it stops for: the time limit when it is near (Slurm's
    pre-timeout signal, ``lead`` seconds ahead), else a signal someone sent by hand
    (``scancel --signal``), which the trap cannot tell apart otherwise."""
    if deadline is None:
        return f"time limit in {lead} s"
    left = deadline - now
    if left > lead + 60:
        return f"stop signal received with {left / 60:.0f} min left before the time limit"
    return f"time limit in {max(0, round(left))} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.hooks")
    hooks = ["start", "end", "stop", "place", "spares", "guard"]
    parser.add_argument("hook", choices=hooks)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--srun-pid", type=int, default=None)
    # The job's time limit (Unix time), given by scripts that know it (older ones do not).
    parser.add_argument("--deadline", type=float, default=None)
    # Given by a batch script that loops on RESTART_EXIT (older scripts do not).
    parser.add_argument("--can-restart", action="store_true")
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    attempt = AttemptId.from_env(os.environ)
    if args.hook == "start" and os.environ.get("DDLAUNCH_SWEEP_ID"):
        # A sweep member's run directory is created at its first start (the array script
        # does it unless Python was not usable before launch.setup): a no-op when done.

        start_task(run_dir)
    elif args.hook == "start":
        adopted = adopt(run_dir, attempt.job_id, os.environ)
        if adopted:
            print(adopted, flush=True)
    # One short process, one decision: with the controller down, go to what matters.
    client = SlurmClient(skip_reads_when_down=True)
    if args.hook == "start":
        start(run_dir, client, attempt, os.environ, HookSettings.of_run(run_dir))
        return 0
    settings = HookSettings.of_run(run_dir)
    if args.hook == "place":
        return print_placement(run_dir, os.environ, client, settings.nodes, settings.min_nodes)
    if args.hook == "guard":
        return exec_guard(run_dir, os.environ, settings.bad_node_ttl_hours)
    if args.hook == "spares":
        found, _ = next_placement(run_dir, os.environ, client, settings.nodes, settings.min_nodes)
        check_spares(run_dir, client, attempt, found.spares if found else ())
        return 0
    if args.hook == "stop":
        source = checkpoint_source(run_dir, read_config_tree(run_dir))
        request = stopping.StopRequest(run_dir, attempt, source, client, args.srun_pid)
        request.on_saved = lambda stop: conclude_saved(run_dir, client, attempt, settings, stop)
        why = stop_reason(args.deadline, time.time(), settings.signal_lead)
        request.run(why, stopping.budget(settings.signal_lead))
        return 0
    return end(run_dir, args.exit_code, client, attempt, settings, args.can_restart)


if __name__ == "__main__":
    sys.exit(main())
