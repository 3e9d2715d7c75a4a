"""The watchdog: ``python -m ddlaunch.job.watchdog --srun-pid PID`` (batch host, torch-free).

Runs in the background beside the training step on the batch host. Every few seconds it reads
the heartbeat records of this attempt (one file per node; each record kind once a cycle; a
node's summary decides a healthy node, its ranks are decoded only when it is a suspect),
writes ``health/watchdog.json`` (a summary for ``status``) and asks
``policy.heartbeats.analyse`` whether the attempt is hung or a node straggles. On a finding
it writes ``health/verdict-<job>-<restart>.json`` (cause, blamed nodes, detail) and ends
the training step with ``scancel --signal=KILL`` on it; srun then returns, and the end hook
(``job.hooks end``) reads the verdict, excludes the nodes and requeues through the usual
path. It exits when srun does. Inert for code that never beats
(no ``Session``).

Two more duties (``job.watches``): it prints the in-rank preflight's verdicts into the batch
log and ends a preflight that has not decided within ``health.preflight_timeout``; and when a
node dies under the attempt (its ranks' peers fail, srun keeps waiting for it) it says so in
the batch log at once. Slurm's own requeue follows when Slurm declares the node down, unless
the job has hot spares or ``nodes.min``: then the watchdog records a node-failure verdict and
ends the step at once, and the end hook decides: the ranks restart without that node, the job
is requeued excluding it, or the run ends (its caps reached).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.config import load_config
from ddlaunch.job.placement import step_nodelist
from ddlaunch.job.stop import LimitWatch, StopRequest
from ddlaunch.job.watches import (
    NodeFailureWatch,
    PreflightWatch,
    alive,
    end_step,
    end_step_without,
)
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.requeue import CAUSE_NODE_FAILURE
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, exclusions
from ddlaunch.store import watchdog as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.heartbeats import AttemptBeats, read_attempt
from ddlaunch.store.rundir import checkpoint_source, config_path
from ddlaunch.wording import plural


class StopSignal:
    """The batch script's SIGTERM once srun has returned (``kill "$watchdog_pid"``): the
    watchdog finishes the poll in hand, records the ranks' last beats and leaves, instead of
    dying in its sleep with the attempt's last steps unrecorded. Only a flag: a verdict being
    written or a step being ended is never cut short."""

    def __init__(self) -> None:
        self.received = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.received = True

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` that ends early once the signal came."""
        deadline = time.monotonic() + seconds
        while not self.received and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))


def poll_period(t: analysis.Thresholds) -> float:
    return max(1.0, min(5.0, t.hang_timeout / 6, t.heartbeat_interval))


@dataclass
class _Watch:
    """What one watchdog keeps between polls."""

    run_dir: Path
    attempt: AttemptId
    thresholds: analysis.Thresholds
    expected_ranks: int | None
    client: SlurmClient
    started: float
    state: analysis.StragglerState = field(default_factory=analysis.StragglerState)
    last_step: int | None = None
    in_process: bool = False  # fault_tolerance.restart: in_process

    def beats(self) -> AttemptBeats:
        """This attempt's beats: a summary per node (its ranks decoded only on demand)."""
        a = self.attempt
        return read_attempt(self.run_dir, a.job_id, a.restart, self.started - 60, a.relaunch)

    def on_dead_nodes(
        self, nodes: NodeFailureWatch | None, now: float, beats: AttemptBeats
    ) -> analysis.Finding | None:
        """Say a node that died under the attempt; where the job can continue without it
        (hot spares, nodes.min: ``nodes.act``), also end the step at once (the finding)."""
        if nodes is None or nodes.found:
            return None
        dead, why = nodes.poll(now, beats.nodes, self.thresholds.stale_after, self.client)
        if not dead:
            return None
        into = f"({now - self.started:.0f} s into the attempt)"
        if self.in_process and set(dead) <= set(exclusions.excluded(self.run_dir)):
            # The in-process restart moved the node's ranks to a spare already (it excludes
            # the node as it decides): the step trains on; ending it would undo that.
            print(
                f"[ddlaunch watchdog] node failure: {why} {into}; its ranks moved to a "
                "spare in process",
                flush=True,
            )
            return None
        if not nodes.act:
            # Said, not acted on: see NodeFailureWatch for why Slurm must requeue. Kept in
            # the attempt, so that the next start blames the node even if it is back by then.
            attempts.update_open(self.run_dir, dead_nodes=list(dead), dead_why=why)
            print(
                f"[ddlaunch watchdog] node failure: {why} {into}; Slurm requeues the job "
                "once it declares the node down",
                flush=True,
            )
            return None
        return analysis.Finding(CAUSE_NODE_FAILURE, tuple(dead), f"{why} {into}")

    def analyse(self, now: float, beats: AttemptBeats) -> analysis.Finding | None:
        """Summarise the beats for ``status`` and ``report``; the finding, if any."""
        self.record(now, beats)
        return analysis.analyse_nodes(
            beats.nodes, beats.ranks_of, now, self.thresholds, self.state, self.expected_ranks
        )

    def record(self, now: float, beats: AttemptBeats) -> None:
        """The summary ``status`` shows, and a step-history sample when the step advanced."""
        a = self.attempt
        ids = {"job_id": a.job_id, "restart": a.restart, "relaunch": a.relaunch}
        left_out = exclusions.excluded(self.run_dir)  # e.g. a node an in-process restart left
        fields = analysis.summary_of(beats.nodes, now, left_out)
        summary = records.Summary.from_json({**fields, **ids})
        records.write_summary(self.run_dir, summary)
        if summary.step is not None and summary.step != self.last_step:
            self.last_step = summary.step
            records.append_sample(self.run_dir, summary)

    def act(self, finding: analysis.Finding, now: float, srun_pid: int | None = None) -> None:
        """Record the verdict for the end hook, then end the training step (for a dead node:
        ``end_step_without``, which returns srun to the batch script at once)."""
        verdict = records.Verdict(
            cause=finding.cause,
            nodes=tuple(finding.nodes),
            ranks=tuple(finding.ranks),
            detail=finding.detail,
            time=now,
            job_id=self.attempt.job_id,
            restart=self.attempt.restart,
        )
        records.write_verdict(self.run_dir, self.attempt, verdict)
        print(f"[ddlaunch watchdog] {finding.cause}: {finding.detail}", flush=True)
        if finding.cause == CAUSE_NODE_FAILURE and srun_pid is not None:
            end_step_without(self.attempt.job_id, self.client, srun_pid)
            # What follows (a restart without the node, a requeue excluding it, or the run's
            # end) is the end hook's decision, which it prints: only what was done is said.
            dead = ", ".join(finding.nodes)
            print(
                f"[ddlaunch watchdog] ended the step without waiting for {dead}; "
                "the end hook decides what follows",
                flush=True,
            )
        elif self.attempt.job_id:
            ended = end_step(self.attempt.job_id, self.client)
            print(
                f"[ddlaunch watchdog] ended {plural(len(ended), 'step')} {', '.join(ended)}",
                flush=True,
            )


def watch(
    run_dir: Path,
    *,
    attempt: AttemptId,
    thresholds: analysis.Thresholds,
    expected_ranks: int | None,
    srun_pid: int | None,
    client: SlurmClient,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Any] = time.sleep,
    max_polls: int | None = None,
    preflight_timeout: float | None = None,
    heartbeats: bool = True,
    nodes: NodeFailureWatch | None = None,
    limit: LimitWatch | None = None,
    stopped: Callable[[], bool] = lambda: False,
    in_process: bool = False,
) -> analysis.Finding | None:
    """Poll until srun ends, ``stopped()`` says so (or ``max_polls``); the finding that
    ended the step, if any."""
    w = _Watch(run_dir, attempt, thresholds, expected_ranks, client, clock(), in_process=in_process)
    gate = PreflightWatch(run_dir, attempt, preflight_timeout)
    polls = 0
    while (srun_pid is None or alive(srun_pid)) and not stopped():
        now = clock()
        if gate.poll(now - w.started, client):
            return None
        if limit is not None and limit.poll(now):
            return None  # stopped before the time limit (trainer.stop_before_limit)
        beats = w.beats() if heartbeats else AttemptBeats(("", 0, 0), 0.0)
        dead = w.on_dead_nodes(nodes, now, beats)
        if dead is not None:
            if beats:
                # The step this poll read goes into the step history before the step ends:
                # returning from here skips both ``analyse`` and the last beats' record after
                # the loop, and a short attempt (a node lost before its first checkpoint) may
                # have no other sample with a step (its ranks' first beats come before their
                # first step): its step line in ``report`` was its first step alone.
                w.record(now, beats)
            w.act(dead, now, srun_pid)
            return dead
        if beats:
            finding = w.analyse(now, beats)
            if finding is not None:
                w.act(finding, now)
                return finding
        polls += 1
        if max_polls is not None and polls >= max_polls:
            return None
        if not heartbeats:
            sleep(1.0)
            continue
        # Ranks failed while srun still runs: look again soon, a node may be gone.
        soon = nodes is not None and not nodes.found and nodes.pending()
        sleep(min(1.0, poll_period(thresholds)) if soon else poll_period(thresholds))
    if heartbeats:
        # srun ended between two polls: the ranks' last beats (the final step) still go
        # into the step history, even of an attempt shorter than one poll period.
        beats = w.beats()
        if beats:
            w.record(clock(), beats)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.watchdog")
    parser.add_argument("--srun-pid", type=int, required=True)
    parser.add_argument("--deadline", type=float, default=None, help="time limit (Unix time)")
    args = parser.parse_args(argv)

    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    cfg = load_config(config_path(run_dir))
    h = cfg.health
    thresholds = analysis.Thresholds.of(h)
    world = os.environ.get("DDLAUNCH_WORLD_SIZE", "")
    attempt = AttemptId.from_env(os.environ)
    client = SlurmClient()
    stop = StopSignal()
    stop.install()
    limit = None
    if args.deadline and cfg.trainer.stop_before_limit:
        request = StopRequest(run_dir, attempt, checkpoint_source(run_dir), client, args.srun_pid)
        limit = LimitWatch(request, args.deadline)
    watch(
        run_dir,
        attempt=attempt,
        thresholds=thresholds,
        expected_ranks=int(world) if world.isdigit() else None,
        srun_pid=args.srun_pid,
        client=client,
        preflight_timeout=float(h.preflight_timeout) if h.preflight else None,
        heartbeats=h.watchdog,
        nodes=NodeFailureWatch(
            run_dir,
            attempt,
            time.time() - 5,
            cfg.ranks_per_node,
            step_nodelist(os.environ),
            act=cfg.elastic,
        ),
        limit=limit,
        sleep=stop.sleep,
        stopped=lambda: stop.received,
        in_process=cfg.fault_tolerance.restart == "in_process",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
