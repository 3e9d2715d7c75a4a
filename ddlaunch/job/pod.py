"""The pod entry of ``--target kubernetes``: ``python -m ddlaunch.job.pod`` (torch-free).

Each pod of the JobSet or PyTorchJob is one node of the run. Its entry plays the parts that
srun and the batch host play on Slurm:

* it starts one rank per GPU, ``python -m ddlaunch.worker.task <run>/submitit`` (the same rank
  runner and submitit pickle as srun's tasks), each with its local rank, its logs in
  ``logs/rank-<R>.out|err``; the first rank that fails ends the pod's others (srun's
  ``--kill-on-bad-exit``); SIGTERM from Kubernetes (a restart, Kueue preemption, a drain) is
  passed to the ranks, which save at the next step boundary;
* the leader pod (node 0) opens the attempt record before its ranks start (closing one that
  Kubernetes cut off: ``restarted by Kubernetes``), and when its ranks end it concludes the
  attempt with ``conclude.conclude``: the one requeue policy decides, and the decision
  becomes the pod's exit code (``policy.pod_exit``), written for the other pods
  (``store.pods``);
* every other pod ends its ranks when that decision appears and exits with the same code, so
  the whole gang tells Kubernetes one thing: restart (``RETRY_EXIT``), stop (``STOP_EXIT``) or
  completed (0). When its own ranks failed and no decision comes within ``DECISION_WAIT_S``
  (the leader's node died), it exits with ``RETRY_EXIT`` and the next attempt's leader
  records the lost one.

What is not done in a pod: the in-rank preflight and the heartbeat watchdog (both act through
Slurm: node exclusion, ``scancel``); ``health.preflight`` and ``health.watchdog`` are inert.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType

from ddlaunch.conclude import Conclusion, conclude
from ddlaunch.job.hooks import HookSettings, conclude_signal_save
from ddlaunch.planning import pod_env
from ddlaunch.policy import pod_exit
from ddlaunch.policy import requeue as policy
from ddlaunch.policy.requeue import Ending
from ddlaunch.rank_processes import Rank, signal_running, start_rank, stop_ranks
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store import attempts, pods, signal_save
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.layout import LOGS_DIR, SUBMITIT_DIR
from ddlaunch.store.rundir import committed_step
from ddlaunch.wording import counted

POLL_S = 0.2
KILL_GRACE_S = 10.0  # SIGTERM, then SIGKILL: the ranks' stop flag may need a step to act
DECISION_WAIT_S = 300.0


class PodRestart:
    """What ``conclude`` requeues through in a pod: nothing to call, the exit code does it
    (Kubernetes has no per-job node exclusion that outlives a restart, so none is set)."""

    def __init__(self) -> None:
        self.requested = False

    def exclude_nodes(self, job: str, nodes: Iterable[str]) -> bool:
        return False

    def restarts(self, job: str) -> int | None:
        return None  # the attempt number is Kubernetes' own count, not asked here

    def requeue(self, job: str) -> None:
        self.requested = True

    def accounting_rows(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        return {}  # no accounting: only cancel.json says a stop was wanted


def attempt_number(run_dir: Path, pod: pod_env.PodIdentity, env: Mapping[str, str]) -> int:
    """The attempt this pod belongs to: the JobSet's restart-attempt annotation, or (a
    PyTorchJob has none) this pod's own start count, equal for every pod of an attempt."""
    if pod.kind == "jobset":
        return int(env.get(pod_env.RESTART_VAR) or 0)
    return pods.next_incarnation(run_dir, pod.index)


def open_attempt(run_dir: Path, attempt: AttemptId, pod: pod_env.PodIdentity, host: str) -> None:
    """The leader's start hook: close an attempt Kubernetes cut off, open this one."""
    records = attempts.load(run_dir)
    step = committed_step(run_dir)
    if records and records[-1].is_open:
        records[-1] = attempts.close(
            records[-1], cause=policy.CAUSE_RESTARTED, committed_step=step, blamed=[]
        )
    record = attempts.new_record(
        len(records), attempt, nodes=counted(pod.nodes, "pod"), host=host, resumed_from=step
    )
    records.append(record)
    attempts.save(run_dir, records)
    origin = f"step {step}" if step is not None else "scratch"
    print(f"[ddlaunch] attempt {len(records) - 1} of {attempt.job_id}, from {origin}", flush=True)


def start_ranks(run_dir: Path, pod: pod_env.PodIdentity, env: Mapping[str, str]) -> list[Rank]:
    logs = run_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-u", "-m", "ddlaunch.worker.task", str(run_dir / SUBMITIT_DIR)]
    return [
        start_rank(
            command,
            {**env, pod_env.LOCAL_RANK_VAR: str(local)},
            logs,
            pod.index * pod.ranks_per_node + local,
        )
        for local in range(pod.ranks_per_node)
    ]


def _reap_orphans() -> None:
    # As PID 1 of the container, orphaned grandchildren (data loader workers of a killed
    # rank) are ours to reap.
    if os.getpid() != 1:
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def wait_ranks(procs: list[Rank], decided: Callable[[], bool] = lambda: False) -> int | None:
    """The ranks' exit code: 0, or the first failure's (the others are then ended). None
    when ``decided()`` says the attempt ended elsewhere (the ranks are then ended)."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            stop_ranks(procs, KILL_GRACE_S)
            return int(failed[0])
        if all(c == 0 for c in codes):
            return 0
        if decided():
            stop_ranks(procs, KILL_GRACE_S)
            return None
        _reap_orphans()
        time.sleep(POLL_S)


def conclude_attempt(run_dir: Path, attempt: AttemptId, ranks_exit: int) -> int:
    """The leader's end hook: how the attempt ended, the one policy's decision, the exit
    code every pod leaves with (recorded for them)."""
    settings = HookSettings.of_run(run_dir)
    client = PodRestart()
    saved = signal_save.read(run_dir, attempt)
    conclusion: Conclusion
    if saved is not None:
        conclusion = conclude_signal_save(run_dir, saved, attempt, settings, client, ranks_exit)
    else:
        cause = policy.CAUSE_COMPLETED if ranks_exit == 0 else policy.CAUSE_CRASH
        ending = Ending(cause, committed_step(run_dir), record={"exit_code": ranks_exit})
        budget = settings.requeues_only
        conclusion = conclude(run_dir, ending, budget, client, job=attempt.task)
    code = pod_exit.exit_code(conclusion.requeued, conclusion.state)
    pods.write_decision(run_dir, attempt, code, conclusion.state, conclusion.decision.reason)
    return code


def follow_leader(run_dir: Path, attempt: AttemptId, procs: list[Rank], since: float) -> int:
    """A non-leader pod: run until the leader's decision, then leave with its code."""

    def decision() -> pods.PodDecision | None:
        found = pods.read_decision(run_dir, attempt)
        # A decision older than this pod belongs to an earlier start with the same number
        # (a suspended and resumed JobSet keeps its restart attempt).
        return found if found is not None and (found.time or 0) >= since else None

    ranks_exit = wait_ranks(procs, lambda: decision() is not None)
    deadline = None if ranks_exit in (None, 0) else time.monotonic() + DECISION_WAIT_S
    while (found := decision()) is None:
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"[ddlaunch] no decision from node 0 within {DECISION_WAIT_S:.0f} s after "
                f"this node's ranks failed (exit {ranks_exit}): asking for a restart",
                flush=True,
            )
            return pod_exit.RETRY_EXIT
        _reap_orphans()
        time.sleep(POLL_S)
    print(f"[ddlaunch] node 0 concluded: {found.reason}", flush=True)
    assert found.exit_code is not None  # read_decision gives none without it
    return found.exit_code


def run_pod(env: Mapping[str, str]) -> int:
    started = time.time()
    run_dir = Path(env["DDLAUNCH_RUN_DIR"])
    pod = pod_env.PodIdentity.from_env(env)
    env = {**env, pod_env.RESTART_VAR: str(attempt_number(run_dir, pod, env))}
    attempt = AttemptId.from_env(env)
    host = env.get(pod_env.NODE_NAME_VAR) or os.uname().nodename
    print(
        f"[ddlaunch] pod of node {pod.index}/{pod.nodes} on {host}, attempt {attempt.key}, "
        f"{counted(pod.ranks_per_node, 'rank')} (logs: {run_dir / LOGS_DIR})",
        flush=True,
    )
    if pod.leader:
        open_attempt(run_dir, attempt, pod, host)
    procs = start_ranks(run_dir, pod, env)

    def forward(signum: int, frame: FrameType | None) -> None:
        # Kubernetes is deleting the pod: the ranks save on their stop flag and leave.
        print(f"[ddlaunch] {signal.Signals(signum).name}: passed to the ranks", flush=True)
        signal_running(procs, signum)

    signal.signal(signal.SIGTERM, forward)
    if not pod.leader:
        return follow_leader(run_dir, attempt, procs, started)
    ranks_exit = wait_ranks(procs)
    return conclude_attempt(run_dir, attempt, 0 if ranks_exit is None else ranks_exit)


def main() -> int:
    try:
        return run_pod(os.environ)
    except (KeyError, ValueError) as exc:
        print(f"[ddlaunch] not a pod rendered by ddlaunch: {exc}", file=sys.stderr, flush=True)
        return pod_exit.STOP_EXIT


if __name__ == "__main__":
    sys.exit(main())
