"""Hooks the batch script runs around srun: ``python -m ddlaunch.jobhooks start|end``.

``start`` opens an attempt record (nodes, the step it resumes from) and, if the previous
attempt never closed (Slurm requeued the job after a node failure, or the batch host died),
closes that one and blames the nodes Slurm now reports as bad. ``end`` closes the attempt
after srun returned and applies the requeue policy (``attempts.decide``): requeue the job
(excluding blamed nodes) or record the final outcome. Torch-free: it runs on the batch host
in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from ddlaunch import attempts, fsutil
from ddlaunch.runs import checkpoint_root
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.parse import node_is_bad, requeue_target

EXCLUDED_FILE = "excluded_nodes.json"


def committed_step(run_dir: Path) -> int | None:
    from ddlaunch.checkpoint.layout import latest_complete

    root = checkpoint_root(run_dir)
    info = latest_complete(root) if root.is_dir() else None
    return info.step if info else None


def expand(nodelist: str) -> list[str]:
    from ddlaunch.worker.distenv import expand_hostlist

    return expand_hostlist(nodelist) if nodelist else []


def excluded(run_dir: Path) -> list[str]:
    return list(fsutil.read_json(run_dir / EXCLUDED_FILE, []) or [])


def add_excluded(run_dir: Path, nodes: list[str], reason: str) -> list[str]:
    current = excluded(run_dir)
    merged = sorted(set(current) | set(nodes))
    if merged != current:
        fsutil.atomic_write_json(run_dir / EXCLUDED_FILE, merged, 0o600)
        log = fsutil.read_json(run_dir / "blame.json", []) or []
        log.append({"time": time.time(), "nodes": sorted(nodes), "reason": reason})
        fsutil.atomic_write_json(run_dir / "blame.json", log, 0o600)
    return merged


def start(run_dir: Path, client: SlurmClient) -> None:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    records = attempts.load(run_dir)
    step = committed_step(run_dir)
    if records and "end" not in records[-1]:
        # The previous attempt was cut off without reaching ``end``: Slurm requeued it.
        prev_nodes = expand(records[-1].get("nodes", ""))
        states = client.node_states(prev_nodes) if prev_nodes else {}
        blamed = sorted(n for n, s in states.items() if node_is_bad(s))
        records[-1].update(
            {
                "end": time.time(),
                "cause": attempts.CAUSE_REQUEUED_BY_SLURM,
                "committed_step": step,
                "blamed": blamed,
                "node_states": states,
            }
        )
        if blamed:
            add_excluded(
                run_dir, blamed, "node failure: " + ", ".join(f"{n} {states[n]}" for n in blamed)
            )
    records.append(
        {
            "attempt": len(records),
            "job_id": job_id,
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "nodes": os.environ.get("SLURM_JOB_NODELIST", ""),
            "batch_host": os.uname().nodename,
            "start": time.time(),
            "resumed_from": step,
        }
    )
    attempts.save(run_dir, records)
    print(
        f"[ddlaunch] attempt {len(records) - 1} on {records[-1]['nodes']}, resuming from "
        f"{'step ' + str(step) if step is not None else 'scratch'}",
        flush=True,
    )


def silent_ranks(run_dir: Path, job_id: str, restart: int, world_size: int) -> list[int]:
    """Ranks of this attempt that died without writing a failure record (killed, not
    raised): their node is a suspect."""
    from ddlaunch.runs import read_failures

    recorded = {
        f.rank
        for f in read_failures(run_dir)
        if str(f.job_id) == job_id and (f.attempt or 0) == restart
    }
    return [r for r in range(world_size) if r not in recorded]


def slurmd_reachable(address: str, port: int, timeout: float = 3.0) -> bool:
    """A TCP connect to the node's slurmd: refused or timed out means the node is gone,
    seconds before slurmctld declares it down (SlurmdTimeout)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def blame_nodes(
    run_dir: Path, current: dict, client: SlurmClient, ranks_per_node: int
) -> tuple[list[str], str]:
    """Nodes to blame for a failed srun: reported bad by Slurm, or hosting ranks that died
    silently and whose slurmd no longer answers. Returns (nodes, explanation)."""
    nodes = expand(current.get("nodes", ""))
    if not nodes:
        return [], ""
    states = client.node_states(nodes)
    bad = {n: f"{n} {s}" for n, s in states.items() if node_is_bad(s)}
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    silent = silent_ranks(run_dir, job_id, restart, len(nodes) * ranks_per_node)
    suspects = sorted({nodes[r // ranks_per_node] for r in silent} - set(bad))
    if suspects:
        port = client.slurmd_port()
        for node in suspects:
            address = client.node_address(node) or node
            if port and not slurmd_reachable(address, port):
                bad[node] = f"{node} slurmd unreachable at {address}:{port}"
    return sorted(bad), ", ".join(bad[n] for n in sorted(bad))


def end(
    run_dir: Path, exit_code: int, client: SlurmClient, max_requeues: int, ranks_per_node: int = 1
) -> int:
    """Close the attempt; requeue or record the outcome. Returns the script's exit code."""
    records = attempts.load(run_dir)
    if not records:
        return exit_code
    current = records[-1]
    if "end" in current:
        # Closed by rank 0 already: it saved on the signal and requeued the job itself.
        return 0
    step = committed_step(run_dir)
    blamed: list[str] = []
    cancelled = attempts.cancel_reason(run_dir) is not None
    if not cancelled:
        # A node failed the preflight inside the ranks (or the ranks ended before its
        # verdict): exclude it and requeue, or stop, before anything else is blamed.
        from ddlaunch.health.hooks import preflight_outcome

        nodes = expand(current.get("nodes", ""))
        outcome = preflight_outcome(run_dir, client, nodes, failed=exit_code != 0)
        if outcome is not None:
            return outcome
    if cancelled:
        cause = attempts.CAUSE_CANCELLED
    elif exit_code == 0:
        cause = attempts.CAUSE_COMPLETED
    else:
        cause = attempts.CAUSE_CRASH
        # srun may return before Slurm notices a dead node: blame nodes Slurm reports as bad
        # or whose slurmd stopped answering, and keep them out of the next attempt.
        blamed, why = blame_nodes(run_dir, current, client, ranks_per_node)
        if blamed:
            cause = attempts.CAUSE_NODE_FAILURE
            add_excluded(run_dir, blamed, "node failure: " + why)
    # The health watchdog ended this attempt (hang or straggler): its verdict names the cause
    # and the nodes to exclude (ddlaunch.health).
    from ddlaunch.health import hooks as health_hooks
    from ddlaunch.health import policy as health_policy

    health = None
    if cause not in (attempts.CAUSE_CANCELLED, attempts.CAUSE_COMPLETED):
        health = health_hooks.apply_watchdog_verdict(run_dir, current)
    extra: dict = {}
    if health is not None:
        cause, blamed, detail = health
        extra = {"health": detail}
    decision = health_policy.decide(
        cause=cause,
        blamed=blamed if health is not None else [],
        committed_now=step,
        resumed_from=current.get("resumed_from"),
        requeues_so_far=len(records) - 1,
        max_requeues=max_requeues,
    )
    attempts.end_last(
        run_dir,
        cause=cause,
        committed_step=step,
        exit_code=exit_code,
        decision=decision.reason,
        blamed=blamed,
        **extra,
    )
    job_id = requeue_target(os.environ)
    if decision.requeue and job_id:
        print(f"[ddlaunch] {decision.reason}", flush=True)
        # Exclude and requeue (in the other order when Slurm refuses to update a running job).
        health_hooks.requeue_excluding(client, job_id, excluded(run_dir))
        return 0
    state = {attempts.CAUSE_COMPLETED: "COMPLETED", attempts.CAUSE_CANCELLED: "CANCELLED"}.get(
        cause, "FAILED"
    )
    attempts.write_outcome(run_dir, state, decision.reason)
    print(f"[ddlaunch] {state}: {decision.reason}", flush=True)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.jobhooks")
    parser.add_argument("hook", choices=["start", "preflight", "end"])
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    if args.hook == "start" and os.environ.get("DDLAUNCH_SWEEP_ID"):
        # A sweep member's run directory is created at its first start (the array script
        # does it unless Python was not usable before launch.setup): a no-op when done.
        from ddlaunch.sweep_members import start_task

        start_task(run_dir)
    import yaml

    tree = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    max_requeues = int((tree.get("fault_tolerance") or {}).get("max_requeues", 3))
    nodes_cfg = tree.get("nodes") or {}
    ranks_per_node = int(nodes_cfg.get("gpus_per_node") or nodes_cfg.get("tasks_per_node") or 1)
    client = SlurmClient()
    if args.hook == "start":
        start(run_dir, client)
        return 0
    if args.hook == "preflight":
        from ddlaunch.health.hooks import preflight_hook

        return preflight_hook(run_dir, client)
    return end(run_dir, args.exit_code, client, max_requeues, ranks_per_node)


if __name__ == "__main__":
    sys.exit(main())
