"""Two duties of the watchdog besides hangs and stragglers (batch host, torch-free).

``PreflightWatch``: the in-rank preflight (``ddlaunch.worker.gate``) seen from the batch
host: print its verdicts into the batch log once the gate opens, and end the step when it has
not decided within ``health.preflight_timeout``, not counting the time nodes spend staging
data while their staging records show it moving (``storage.stage`` can take far longer).

``NodeFailureWatch``: a node that died under the attempt, found before Slurm marks it DOWN,
said in the batch log with its time; acted on only by a job that can continue without it
(hot spares, ``nodes.min``; its docstring says why not otherwise).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ddlaunch.job.blame import blame_nodes, expand
from ddlaunch.policy.heartbeats import NodeSummary, partly_stale
from ddlaunch.policy.preflight import node_report_line
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import preflight as records
from ddlaunch.store import staging as staging_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import rank_records


def end_step_without(job_id: str | None, client: SlurmClient, srun_pid: int) -> None:
    """End a step one of whose nodes died: ``scancel`` reaches the ranks on the nodes still
    up but waits for the dead one (MessageTimeout), and srun waits for that node's tasks until
    Slurm declares it down (24-30 s on the dev cluster, SlurmdTimeout on a site): so scancel
    runs aside for a moment, and srun is killed, which returns the batch script to its end
    hook at once. The next step takes the same nodes' resources with ``--overlap``."""
    if job_id:
        aside = threading.Thread(target=_cancel_quietly, args=(job_id, client), daemon=True)
        aside.start()
        aside.join(2.0)
    with contextlib.suppress(ProcessLookupError):
        os.kill(srun_pid, signal.SIGKILL)


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` (srun, on this host) still exists; one of another user's
    counts (EPERM: it exists). None: no process to watch."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cancel_quietly(job_id: str, client: SlurmClient) -> None:
    with contextlib.suppress(Exception):  # srun is killed whatever scancel says
        end_step(job_id, client)


def end_step(job_id: str, client: SlurmClient) -> list[str]:
    """End the job's running steps (``scancel --signal=KILL JOB.STEP``, never the batch step);
    returns them."""
    steps: list[str] = client.job_steps(job_id)
    if steps:
        client.cancel(steps, signal="KILL")
    return steps


class PreflightWatch:
    """Print the gate's verdicts once it opens; end a preflight that has not decided within
    ``timeout`` (a node hung in the rendezvous or in ``import torch``: the end hook then
    judges from the node reports on disk)."""

    def __init__(self, run_dir: Path, attempt: AttemptId, timeout: float | None) -> None:
        self.run_dir, self.attempt, self.timeout = run_dir, attempt, timeout
        self.done = timeout is None

    def poll(self, elapsed: float, client: SlurmClient) -> bool:
        """True when the step was ended because the preflight timed out."""
        if self.done:
            return False
        gate = records.read_gate(self.run_dir, self.attempt)
        if gate is not None:
            self.done = True
            if gate.passed and not gate.printed:
                self._print_passed(gate.reason or "")
                records.mark_printed(self.run_dir, self.attempt, gate)
            return False
        assert self.timeout is not None
        if elapsed - self.staging_seconds(time.time()) < self.timeout:
            return False
        self.done = True
        print(
            f"[ddlaunch watchdog] preflight undecided after {self.timeout:.0f} s "
            "(health.preflight_timeout): ending the step",
            flush=True,
        )
        if self.attempt.job_id:
            end_step(self.attempt.job_id, client)
        return True

    def staging_seconds(self, now: float) -> float:
        """How long the slowest node has been staging data (or took to): not preflight time.
        A staging whose record has not been rewritten for ``timeout`` has stopped moving
        and no longer counts."""
        longest = 0.0
        for rec in staging_records.read_attempt(self.run_dir, self.attempt).values():
            start = rec.start
            if start is None:
                continue
            if rec.state == staging_records.RUNNING:
                assert self.timeout is not None
                if now - (rec.time or start) > self.timeout:
                    continue
                end = now
            else:
                end = rec.end or now
            longest = max(longest, end - start)
        return longest

    def _print_passed(self, reason: str) -> None:
        for report in records.read_reports(self.run_dir, self.attempt).values():
            if "checks" in report:
                print(node_report_line(report), flush=True)
        print(f"[ddlaunch] preflight: {reason}", flush=True)


def failed_ranks(run_dir: Path, restart: int, not_before: float, relaunch: int = 0) -> list[float]:
    """Times of this attempt's rank failure records (``store.failures``)."""
    times = []
    for _, rec in rank_records(run_dir).values():
        when = rec.get("time")
        if not isinstance(when, (int, float)):
            continue
        same = (rec.get("attempt") or 0) == restart and (rec.get("relaunch") or 0) == relaunch
        if same and when >= not_before:
            times.append(float(when))
    return times


class NodeFailureWatch:
    """A node that died under the attempt, found from the batch host before Slurm marks it
    DOWN: said in the batch log with its time, not acted on.

    Trigger: ranks of this attempt failed (a peer's connection closed) and srun has not
    returned ``grace`` seconds later, because it waits for tasks on a node that no longer
    answers; or some ranks' heartbeats went stale while others' did not (a node that vanished
    without closing its connections). Then the nodes are probed as the end hook does
    (``job.blame.blame_nodes``: Slurm's node state, a TCP connect to slurmd of the nodes
    whose ranks went silent).

    Why not end the attempt and requeue at once (measured on the dev cluster, Slurm 22.05):
    a requeued job stays COMPLETING until Slurm declares the dead node DOWN, so it cannot
    start earlier anyway (the only saving is Slurm's own post-requeue delay, the credential
    lifetime + 1 s); and a GPU job requeued while one of its nodes does not respond comes
    back with a broken gres allocation ("srun: error: Unable to create step ... Invalid
    generic resource (gres) specification"; slurmctld: "_step_get_gres_cnt ... node offset
    invalid"), so its next attempt fails at once. Slurm's own requeue at DOWN is not
    affected. Ending srun early (``scancel`` of the step blocks for MessageTimeout while
    the node does not answer) would only lead the end hook into that requeue. A job with hot
    spares or ``nodes.min`` (``act``) is not requeued: Slurm keeps it (``--no-kill``) and the
    next step leaves the dead node out, so there the watchdog ends the step at once."""

    def __init__(
        self,
        run_dir: Path,
        attempt: AttemptId,
        not_before: float,
        ranks_per_node: int,
        nodelist: str,
        grace: float = 2.0,
        probe_every: float = 5.0,
        act: bool = False,
    ) -> None:
        self.run_dir, self.attempt, self.not_before = run_dir, attempt, not_before
        self.ranks_per_node, self.nodes = ranks_per_node, expand(nodelist)
        self.grace, self.probe_every = grace, probe_every
        # A job with spares or nodes.min (Slurm keeps it, --no-kill): the watchdog ends the
        # step on a dead node and the end hook restarts without it, no requeue involved.
        self.act = act
        self.last_probe = float("-inf")
        self.found: list[str] = []
        self._failures: list[float] = []  # this cycle's failure record times

    def triggered(
        self,
        now: float,
        nodes: Sequence[NodeSummary],
        stale_after: float,
        failures: Sequence[float],
    ) -> bool:
        if failures and now - min(failures) >= self.grace:
            return True
        return partly_stale(nodes, now, stale_after)

    def pending(self) -> bool:
        """Ranks failed but srun is still running: poll again soon. From the failure records
        of this cycle's ``poll`` (read once a cycle: 16,000 files at scale)."""
        return bool(self._failures)

    def failures(self) -> list[float]:
        a = self.attempt
        return failed_ranks(self.run_dir, a.restart, self.not_before, a.relaunch)

    def poll(
        self,
        now: float,
        beats: Sequence[NodeSummary],
        stale_after: float,
        client: SlurmClient,
    ) -> tuple[list[str], str]:
        """(dead nodes, why); empty when nothing is found (or it is not time to probe).
        ``beats``: the attempt's heartbeats, a summary per node."""
        self._failures = self.failures()
        if not self.nodes or not self.triggered(now, beats, stale_after, self._failures):
            return [], ""
        if now - self.last_probe < self.probe_every:
            return [], ""
        self.last_probe = now
        dead, why = blame_nodes(self.run_dir, self.nodes, self.attempt, client, self.ranks_per_node)
        self.found = dead
        return dead, why
