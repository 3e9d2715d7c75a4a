"""Hooks the batch script runs around srun: ``python -m ddlaunch.job.hooks start|end``.

``start`` opens an attempt record (nodes, the step it resumes from) and, if the previous
attempt never closed (Slurm requeued the job after a node failure, or the batch host died),
closes that one and blames the nodes Slurm now reports as bad. ``end`` works out how the
attempt ended (completed, cancelled, a failed preflight, a crash, a node failure, the
watchdog's hang or straggler verdict) and concludes it (``ddlaunch.conclude``): requeue the
job (excluding blamed nodes) or record the final outcome. Torch-free: it runs on the batch
host in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.conclude import cancel_reason, conclude
from ddlaunch.job.blame import bad_nodes, blame_nodes, expand
from ddlaunch.job.preflight import preflight_hook, preflight_outcome
from ddlaunch.job.sweep_task import start_task
from ddlaunch.policy import requeue as policy
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, badnodes, exclusions, outcome
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import committed_step, read_config_tree


@dataclass(frozen=True)
class HookSettings:
    """The few config values the hooks need, read without validating the whole config."""

    max_requeues: int = 3
    ranks_per_node: int = 1
    bad_node_ttl_hours: float = 24.0

    @classmethod
    def from_tree(cls, tree: Mapping[str, Any]) -> HookSettings:
        nodes = tree.get("nodes") or {}
        health = tree.get("health") or {}
        return cls(
            max_requeues=int((tree.get("fault_tolerance") or {}).get("max_requeues", 3)),
            ranks_per_node=int(nodes.get("gpus_per_node") or nodes.get("tasks_per_node") or 1),
            bad_node_ttl_hours=float(health.get("bad_node_ttl_hours", 24.0)),
        )


def start(
    run_dir: Path,
    client: Any,
    attempt: AttemptId,
    env: Mapping[str, str],
    settings: HookSettings = HookSettings(),
) -> None:
    records = attempts.load(run_dir)
    step = committed_step(run_dir)
    if records and attempts.is_open(records[-1]):
        # The previous attempt was cut off without reaching ``end``: Slurm requeued it.
        prev_nodes = expand(records[-1].get("nodes", ""))
        states = client.node_states(prev_nodes) if prev_nodes else {}
        blamed = bad_nodes(states)
        attempts.close(
            records[-1],
            cause=policy.CAUSE_REQUEUED_BY_SLURM,
            committed_step=step,
            blamed=blamed,
            node_states=states,
        )
        if blamed:
            why = "node failure: " + ", ".join(f"{n} {states[n]}" for n in blamed)
            exclusions.add_excluded(run_dir, blamed, why)
            # A node Slurm declared down is evidence about the node: my later jobs avoid it.
            badnodes.record(blamed, why, settings.bad_node_ttl_hours, f"run {run_dir.name}")
    nodes = env.get("SLURM_JOB_NODELIST", "")
    records.append(
        attempts.new_record(
            len(records), attempt, nodes=nodes, host=os.uname().nodename, resumed_from=step
        )
    )
    attempts.save(run_dir, records)
    origin = f"step {step}" if step is not None else "scratch"
    print(f"[ddlaunch] attempt {len(records) - 1} on {nodes}, resuming from {origin}", flush=True)


@dataclass
class Ending:
    """How an attempt ended, as the end hook works it out."""

    cause: str
    blamed: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def crash_or_node_failure(
    run_dir: Path, nodes: list[str], attempt: AttemptId, client: Any, settings: HookSettings
) -> Ending:
    """srun may return before Slurm notices a dead node: blame nodes Slurm reports as bad or
    whose slurmd stopped answering, and keep them out of the next attempt (and, being
    evidence about the node, out of my later jobs: the bad-node list)."""
    blamed, why = blame_nodes(run_dir, nodes, attempt, client, settings.ranks_per_node)
    if not blamed:
        return Ending(policy.CAUSE_CRASH)
    exclusions.add_excluded(run_dir, blamed, "node failure: " + why)
    source = f"run {run_dir.name}"
    badnodes.record(blamed, "node failure: " + why, settings.bad_node_ttl_hours, source)
    return Ending(policy.CAUSE_NODE_FAILURE, blamed)


def watchdog_ending(run_dir: Path, attempt: AttemptId, settings: HookSettings) -> Ending | None:
    """The watchdog ended this attempt (hang or straggler): its verdict names the cause and
    the nodes to exclude from this run. A straggler is evidence about its node (the
    bad-node list takes it); a hang only makes the node a suspect (``badnodes.suspect``):
    a rank stuck in the training code's own frames hangs on any node."""
    verdict = watchdog_records.read_verdict(run_dir, attempt)
    if not verdict:
        return None
    blamed = sorted(str(n) for n in verdict.get("nodes", []))
    detail = str(verdict.get("detail", ""))
    cause = str(verdict.get("cause", policy.CAUSE_HANG))
    if blamed:
        exclusions.add_excluded(run_dir, blamed, f"{cause}: {detail}")
        source = f"run {run_dir.name}"
        hang = cause == policy.CAUSE_HANG
        ttl = settings.bad_node_ttl_hours
        badnodes.record(blamed, f"{cause}: {detail}", ttl, source, suspected=hang)
    return Ending(cause, blamed, {"health": detail})


def end(
    run_dir: Path,
    exit_code: int,
    client: Any,
    attempt: AttemptId,
    settings: HookSettings = HookSettings(),
) -> int:
    """Close the attempt; requeue or record the outcome. Returns the script's exit code."""
    records = attempts.load(run_dir)
    if not records:
        return exit_code
    current = records[-1]
    if not attempts.is_open(current):
        # Closed by rank 0 already: it saved on the signal and requeued the job itself, or
        # it stopped the run (a checkpoint save failed): Slurm's state should say which.
        ended = outcome.read_outcome(run_dir) or {}
        return 1 if ended.get("state") == policy.FAILED else 0
    nodes = expand(current.get("nodes", ""))
    if cancel_reason(run_dir) is not None:
        ending = Ending(policy.CAUSE_CANCELLED)
    else:
        # A node failed the preflight inside the ranks (or the ranks ended before its
        # verdict): exclude it and requeue, or stop, before anything else is blamed.
        code = preflight_outcome(run_dir, client, attempt, nodes, failed=exit_code != 0)
        if code is not None:
            return code
        if exit_code == 0:
            ending = Ending(policy.CAUSE_COMPLETED)
        else:
            ending = watchdog_ending(run_dir, attempt, settings) or crash_or_node_failure(
                run_dir, nodes, attempt, client, settings
            )
    conclusion = conclude(
        run_dir,
        cause=ending.cause,
        committed_step=committed_step(run_dir),
        max_requeues=settings.max_requeues,
        client=client,
        job=attempt.task,
        blamed=ending.blamed,
        record={"exit_code": exit_code, **ending.record},
    )
    return 0 if conclusion.requeued else exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.hooks")
    parser.add_argument("hook", choices=["start", "preflight", "end"])
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    attempt = AttemptId.from_env(os.environ)
    if args.hook == "start" and os.environ.get("DDLAUNCH_SWEEP_ID"):
        # A sweep member's run directory is created at its first start (the array script
        # does it unless Python was not usable before launch.setup): a no-op when done.

        start_task(run_dir)
    client = SlurmClient()
    if args.hook == "start":
        start(run_dir, client, attempt, os.environ, _settings(run_dir))
        return 0
    if args.hook == "preflight":
        nodes = expand(os.environ.get("SLURM_JOB_NODELIST", ""))
        return preflight_hook(run_dir, client, attempt, nodes)
    return end(run_dir, args.exit_code, client, attempt, _settings(run_dir))


def _settings(run_dir: Path) -> HookSettings:
    try:
        return HookSettings.from_tree(read_config_tree(run_dir))
    except Exception as exc:  # an unreadable config must not cost the attempt its record
        print(f"[ddlaunch] warning: {run_dir / 'config.yaml'}: {exc}; defaults used", flush=True)
        return HookSettings()


if __name__ == "__main__":
    sys.exit(main())
