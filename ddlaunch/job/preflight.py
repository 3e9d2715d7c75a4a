"""The preflight seen from the batch host (torch-free), called by the end hook.

``preflight_outcome``: after the ranks failed, did this attempt fail preflight (the in-rank
gate, ``ddlaunch.worker.gate``, or node reports on disk when the ranks ended before the
verdict)? Then exclude the failing nodes and requeue, or stop the run when every node failed
alike or no requeue is left (``apply_decision``, through ``ddlaunch.conclude``).
``check_spares`` runs the node checks on the hot spares as a separate srun step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.conclude import conclude
from ddlaunch.config import Config, load_config
from ddlaunch.policy import preflight as verdicts
from ddlaunch.policy.requeue import CAUSE_PREFLIGHT, Ending, RetryBudget
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import badnodes, exclusions
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import LOGS_DIR, committed_step, config_path

REQUEUED = 75  # the batch script exits 0 without training: Slurm restarts the job
STOPPED = 76  # the batch script exits 1 without training: the outcome is recorded
# The end hook's exit code that tells the batch script to restart the ranks in the allocation
# (templates/partials/launch.sh.j2 tests for it). EX_TEMPFAIL: "try again".
RESTART_EXIT = 75


@dataclass(frozen=True)
class InAllocation:
    """What lets the end hook restart inside the allocation after a node failed preflight:
    restarts the script can do, and whether usable nodes enough are left without the run's
    excluded ones (asked after the failing nodes were excluded: a hot spare, nodes.min)."""

    max_restarts: int
    replaceable: Callable[[], bool]


def preflight_argv(
    python: str,
    nodes: int,
    timeout_s: int,
    log_dir: Path,
    doctor: bool = False,
    spares: Sequence[str] = (),
) -> list[str]:
    """The node task's srun step: on every node of the allocation, or on the ``spares``."""
    where = [f"--nodelist={','.join(spares)}"] if spares else []
    return [
        "srun",
        # Explicit logs: a sweep task exports SLURM_STDOUTMODE for the training ranks' logs.
        f"--output={log_dir / 'preflight-%N.out'}",
        f"--error={log_dir / 'preflight-%N.out'}",
        "--open-mode=append",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        f"--time={max(1, math.ceil(timeout_s / 60))}",
        "--job-name=ddlaunch-preflight",
        *where,
        python,
        "-m",
        "ddlaunch.worker.node_task",
        *(["--doctor"] if doctor else []),
        *(["--spare"] if spares else []),
    ]


def check_spares(
    run_dir: Path, client: SlurmClient, attempt: AttemptId, spares: Sequence[str]
) -> list[str]:
    """The hot spares run the preflight's node checks (GPUs, free space, torch) as the job
    starts, beside the training step, so that a spare is known good before a failure needs
    it: one that fails is excluded from this run (``hooks place`` skips it) and goes on the
    bad-node list. Returns the failing spares."""
    cfg = load_config(config_path(run_dir))
    if not cfg.health.preflight or not spares:
        return []
    timeout = cfg.health.preflight_timeout
    argv = preflight_argv(
        cfg.launch.python, len(spares), timeout, run_dir / LOGS_DIR, spares=spares
    )
    client.run_step(argv, timeout=timeout + 30)
    reports = records.read_reports(run_dir, attempt, spare=True)
    failed = []
    for node in spares:
        # One by one: a spare is in no step with the others, so no bandwidth is measured.
        mine = {node: reports[node]} if node in reports else {}
        (verdict,) = verdicts.evaluate(cfg, [node], mine)
        if mine:
            line = verdicts.node_report_line(mine[node])
            print(line.replace("[ddlaunch preflight ", "[ddlaunch preflight spare ", 1), flush=True)
        if not verdict.ok:
            failed.append(f"{node}: {verdict.reason()}")
    if failed:
        reason = "preflight failed on a spare: " + "; ".join(failed)
        bad = [f.split(":", 1)[0] for f in failed]
        exclusions.add_excluded(run_dir, bad, reason)
        badnodes.record(bad, reason, cfg.health.bad_node_ttl_hours, f"run {run_dir.name}")
        print(f"[ddlaunch] {reason}; left out", flush=True)
        return bad
    print(f"[ddlaunch] preflight: every spare passed ({','.join(spares)})", flush=True)
    return []


def preflight_outcome(
    run_dir: Path,
    client: SlurmClient,
    attempt: AttemptId,
    nodes: Sequence[str],
    failed: bool = True,
    in_allocation: InAllocation | None = None,
) -> int | None:
    """End hook: did this attempt fail preflight (inside the ranks)? (``failed``: srun
    returned nonzero; otherwise only the verdicts are printed, if nobody did yet.)

    The gate record says so when the ranks got that far; otherwise the node reports on disk
    decide (a node without one died, hung or could not import torch before the verdict).
    Returns the script's exit code (0 requeued, 1 stopped, ``RESTART_EXIT``: restart on the
    nodes left, ``in_allocation`` permitting) or None: not a preflight failure, the usual
    crash handling applies."""
    if not nodes:
        return None
    gate = records.read_gate(run_dir, attempt)
    reports = records.read_reports(run_dir, attempt)
    if gate is not None and gate.passed:
        print_verdicts(run_dir, attempt, nodes, reports, gate)
        return None
    # No reports: preflight is off, or the ranks never got as far (srun itself failed).
    if not failed or not reports:
        return None
    cfg = load_config(config_path(run_dir))
    results = verdicts.evaluate(cfg, nodes, reports)
    decision = verdicts.decide(results)
    if not decision.exclude and not decision.stop:
        return None
    if gate is None:
        # The ranks ended before the verdict: record it here.
        records.record_verdicts(
            run_dir, attempt, list(nodes), *verdicts.as_records(results), decision.reason
        )
    print_verdicts(run_dir, attempt, nodes, reports, gate or records.Gate(reason=decision.reason))
    code = apply_decision(cfg, run_dir, client, attempt, decision, in_allocation)
    return {REQUEUED: 0, RESTARTED: RESTART_EXIT}.get(code, 1)


def print_verdicts(
    run_dir: Path,
    attempt: AttemptId,
    nodes: Sequence[str],
    reports: Mapping[str, verdicts.NodeReport],
    gate: records.Gate,
) -> None:
    """Into the batch log, once per attempt (the watchdog does it as soon as the gate opens;
    this covers an attempt that ended first)."""
    if gate.printed:
        return
    for node in nodes:
        if node in reports:
            print(verdicts.node_report_line(reports[node]), flush=True)
    print(f"[ddlaunch] preflight: {gate.reason or ''}", flush=True)
    if gate.job_id is not None:  # a gate on disk (not the end hook's own verdict)
        records.mark_printed(run_dir, attempt, gate)


RESTARTED = 77  # apply_decision: failing nodes excluded, restart on the nodes left


def apply_decision(
    cfg: Config,
    run_dir: Path,
    client: SlurmClient,
    attempt: AttemptId,
    decision: verdicts.PreflightDecision,
    in_allocation: InAllocation | None = None,
) -> int:
    """Act on the preflight decision: 0 (train), ``REQUEUED`` (failing nodes excluded, job
    requeued), ``RESTARTED`` (excluded, the batch script restarts on the nodes left) or
    ``STOPPED`` (outcome recorded)."""
    if not decision.exclude and not decision.stop:
        return 0
    blamed = list(decision.exclude)
    if blamed:
        exclusions.add_excluded(run_dir, blamed, decision.reason)
        source = f"run {run_dir.name}"
        badnodes.record(blamed, decision.reason, cfg.health.bad_node_ttl_hours, source)
    replace = bool(blamed) and in_allocation is not None and in_allocation.replaceable()
    ending = Ending(
        CAUSE_PREFLIGHT,
        committed_step(run_dir),
        blamed=tuple(blamed),
        record={"health": decision.reason} if blamed else {},
        final=decision.reason if decision.stop else None,
    )
    restarts = in_allocation.max_restarts if in_allocation and replace else 0
    budget = RetryBudget(cfg.fault_tolerance.max_requeues, restarts, replace)
    conclusion = conclude(run_dir, ending, budget, client, job=attempt.task)
    if conclusion.restart:
        return RESTARTED
    return REQUEUED if conclusion.requeued else STOPPED
