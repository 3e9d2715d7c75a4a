"""The batch host's guard (torch-free), for a job with hot spares or ``nodes.min``.

With ``--no-kill`` Slurm keeps a job whose batch host died, and nothing is left to conclude
it: measured on the dev cluster (Slurm 22.05), slurmctld logs "Removing failed node node1 from
JobId=2121", kills the batch step, and the job stays RUNNING on its other nodes until the time
limit. So the batch script starts the guard (``python -m ddlaunch.job.hooks guard``) as a
one-task srun step on another node of the allocation, ``python -m ddlaunch.job.guard
--batch-host NODE``: every few seconds it asks Slurm whether the batch host is still part of
the job and, once Slurm removed it (its own verdict on a failed node; sinfo keeps showing the
node ``mixed*`` meanwhile) or declares it down, requeues the job without it, as Slurm does
without ``--no-kill``. A node that is only stalled is neither. The next
attempt's start hook closes the cut-off one. The step is named ``ddlaunch-guard`` so that
ending a training step (the watchdog) leaves it running.

Before it requeues, the guard checks that the job can start again without the lost node
(``conclude.check_requeue``): where the partition has too few usable nodes left, a requeue
would pend for good, so the guard concludes the attempt with that node failure and the
numbers as the run's final decision, and ends the job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlaunch.conclude import cancel_reason, check_requeue, conclude, requeue_excluding
from ddlaunch.policy.requeue import CAUSE_NODE_FAILURE, NO_RETRY, Ending
from ddlaunch.slurm.client import SlurmClient, SlurmError
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.slurm.parse import node_is_down
from ddlaunch.slurm.queue import GUARD_STEP_NAME
from ddlaunch.store import attempts, exclusions
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.records import Unreadable
from ddlaunch.store.rundir import LOGS_DIR, committed_step

POLL_S = 2.0


def guard_argv(python: str, node: str, batch_host: str, log_dir: Path) -> list[str]:
    """The guard's srun step: one task on ``node``, beside the training step (``--overlap``),
    logging straight to a file (its srun on the batch host may die first)."""
    log = str(log_dir / "guard-%j.out")
    return [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        f"--nodelist={node}",
        "--kill-on-bad-exit=0",
        f"--job-name={GUARD_STEP_NAME}",
        f"--output={log}",
        f"--error={log}",
        "--open-mode=append",
        python,
        "-m",
        "ddlaunch.job.guard",
        "--batch-host",
        batch_host,
    ]


def guard_node(allocation: Sequence[str], batch_host: str) -> str | None:
    """Where the guard runs: the last node of the allocation that is not the batch host (a
    spare while there is one); None for a one-node job (nothing can watch it)."""
    others = [n for n in allocation if n != batch_host]
    return others[-1] if others else None


def batch_host_lost(client: SlurmClient, job: str, batch_host: str) -> str | None:
    """Why the batch host is lost to the job, or None. Slurm removes a failed node from a
    --no-kill job ("Removing failed node node1 from JobId=...": the job's NodeList no longer
    names it, measured on 22.05; ``sinfo`` meanwhile shows the node ``mixed*``, not down), or
    declares the node down. A node that is only slow to answer is neither."""
    row = client.queue([job]).get(job)
    running = row is not None and row.state == "RUNNING" and bool(row.nodes)
    if running and row is not None and batch_host not in expand_hostlist(row.nodes):
        return f"batch host {batch_host} removed from the job by Slurm (NodeList={row.nodes})"
    state = client.node_states([batch_host]).get(batch_host, "")
    return f"batch host {batch_host} {state}" if node_is_down(state) else None


def watch_batch_host(
    run_dir: Path,
    client: SlurmClient,
    attempt: AttemptId,
    batch_host: str,
    ttl_hours: float,
    *,
    sleep: Callable[[float], Any] = time.sleep,
    max_polls: int | None = None,
) -> bool:
    """Poll until the batch host is lost to the job, then requeue the job without it
    (unless the run was cancelled). True when it acted. Slurm unreachable: keep polling."""
    print(f"[ddlaunch guard] watching batch host {batch_host}", flush=True)
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        try:
            why = batch_host_lost(client, attempt.task, batch_host)
        except Exception:  # the controller is away: ask again
            why = None
        if why is not None:
            act(run_dir, client, attempt, batch_host, why, ttl_hours)
            return True
        sleep(POLL_S)
    return False


def act(
    run_dir: Path, client: SlurmClient, attempt: AttemptId, host: str, why: str, ttl_hours: float
) -> None:
    if cancel_reason(run_dir, attempt.task, client) is not None:
        print(f"[ddlaunch guard] {why}; the run was cancelled: no requeue", flush=True)
        return
    exclusions.leave_out(run_dir, [host], f"node failure: {why}", ttl_hours)
    check = check_requeue(run_dir, client, [host], attempt.task)
    if check.shortage is not None:
        stop(run_dir, client, attempt, host, why, check.shortage)
        return
    # The lost node goes on the record with the guard's words: whoever closes the attempt
    # (the next start, or a cancel of the pending requeue) closes it with this node failure.
    dead = _dead_with(run_dir, host)
    attempts.update_last(run_dir, guard=f"requeued by ddlaunch's guard: {why}", dead_nodes=dead)
    print(f"[ddlaunch guard] {why}: requeueing the job without it", flush=True)
    done = requeue_excluding(client, attempt.task, check.nodes)
    if not done.done:
        print(f"[ddlaunch guard] requeue failed: {done.error}", flush=True)


def _dead_with(run_dir: Path, host: str) -> list[str]:
    """The latest attempt's dead nodes, with ``host``."""
    found = attempts.load(run_dir)
    last = (found[-1].dead_nodes or ()) if found else ()
    return sorted({*last, host})


def stop(
    run_dir: Path, client: SlurmClient, attempt: AttemptId, host: str, why: str, shortage: str
) -> None:
    """No requeue could start: conclude the attempt with the node failure and ``shortage``
    as the run's final decision, then end the job (it would hold its other nodes until the
    time limit). The records come first: the scancel ends this step too."""
    try:
        step = committed_step(run_dir)
    except (OSError, Unreadable, ValueError):
        step = None
    record = {"dead_nodes": _dead_with(run_dir, host), "dead_why": why}
    ending = Ending(CAUSE_NODE_FAILURE, step, blamed=(host,), record=record, final=shortage)
    conclude(run_dir, ending, NO_RETRY, client, job=attempt.task, say=_say)
    try:
        client.cancel([attempt.task])
    except SlurmError as exc:
        print(f"[ddlaunch guard] scancel failed: {exc}", flush=True)


def _say(text: str) -> None:
    print(f"[ddlaunch guard] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.guard")
    parser.add_argument("--batch-host", required=True)
    parser.add_argument("--bad-node-ttl-hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    attempt = AttemptId.from_env(os.environ)
    watch_batch_host(run_dir, SlurmClient(), attempt, args.batch_host, args.bad_node_ttl_hours)
    return 0


def exec_guard(run_dir: Path, env: Mapping[str, str], ttl_hours: float) -> int:
    """``hooks guard`` on the batch host: become the guard's srun (it lives as long as the
    job; a job of one node has nothing to watch it from)."""
    host = os.uname().nodename
    node = guard_node(expand_hostlist(env.get("SLURM_JOB_NODELIST", "")), host)
    if node is None:
        return 0
    argv = guard_argv(sys.executable, node, host, run_dir / LOGS_DIR)
    # srun's own lines (its step terminated when the job ends) go to the guard's log, not
    # into the batch log after the run's outcome.
    log = run_dir / LOGS_DIR / f"guard-{env.get('SLURM_JOB_ID', 'job')}.out"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.execvp(argv[0], [*argv, "--bad-node-ttl-hours", str(ttl_hours)])


if __name__ == "__main__":
    sys.exit(main())
