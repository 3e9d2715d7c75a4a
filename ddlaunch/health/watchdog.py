"""The watchdog: ``python -m ddlaunch.health.watchdog --srun-pid PID`` (batch script, torch-free).

Runs in the background beside the training step on the batch host. Every few seconds it reads
the ranks' heartbeat files of this attempt, writes ``health/watchdog.json`` (a summary for
``status``) and asks ``analysis.analyse`` whether the attempt is hung or a node straggles. On
a finding it writes ``health/verdict-<job>-<restart>.json`` (cause, blamed nodes, detail) and
ends the training step with ``scancel --signal=KILL`` on it; srun then returns, and the end
hook (``jobhooks end``) reads the verdict, excludes the nodes and requeues through the usual
path. It exits when srun does. Inert for code that never beats (no ``Session``).

Two more duties (``PreflightWatch``, ``NodeFailureWatch``): it prints the in-rank preflight's
verdicts into the batch log and ends a preflight that has not decided within
``health.preflight_timeout``; and when a node dies under the attempt (its ranks' peers fail,
srun keeps waiting for it) it says so in the batch log at once; Slurm's own requeue follows
when Slurm declares the node down (``NodeFailureWatch`` says why not sooner).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.health import analysis

WATCHDOG_FILE = ("health", "watchdog.json")


def verdict_path(run_dir: Path, job_id: str, restart: int) -> Path:
    return run_dir / "health" / f"verdict-{job_id or 'local'}-{restart}.json"


def read_verdict(run_dir: Path, job_id: str, restart: int) -> dict[str, Any] | None:
    try:
        return fsutil.read_json(verdict_path(run_dir, job_id, restart))
    except (OSError, ValueError):
        return None


STEPS_FILE = ("health", "steps.jsonl")


def append_sample(run_dir: Path, summary: dict[str, Any]) -> None:
    """One line per poll in which the step advanced (time, step, attempt, busy time per node):
    the step-throughput history ``ddlaunch report`` draws. At most one line per poll period
    (a few seconds), appended without fsync."""
    line = {
        "time": round(summary["time"], 2),
        "step": summary["step"],
        "job_id": summary.get("job_id"),
        "restart": summary.get("restart"),
        "busy": summary.get("busy_per_node", {}),
    }
    try:
        with open(run_dir.joinpath(*STEPS_FILE), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    except OSError:
        pass


def relay_deferred_signal(run_dir: Path, job_id: str, restart: int, client: Any) -> None:
    """Send the pre-timeout signal that arrived during preflight to the training step: the
    ranks have installed their handlers once they send heartbeats."""
    from ddlaunch.health.hooks import deferred_signal_path

    path = deferred_signal_path(run_dir, job_id, restart)
    record = fsutil.read_json(path) if path.exists() else None
    if not record:
        return
    os.replace(path, path.with_suffix(".sent"))
    client.cancel([job_id], signal=str(record["signal"]).removeprefix("SIG"))
    print(f"[ddlaunch watchdog] sent the deferred {record['signal']} to the ranks", flush=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def poll_period(t: analysis.Thresholds) -> float:
    return max(1.0, min(5.0, t.hang_timeout / 6, t.heartbeat_interval))


def end_step(job_id: str, client: Any) -> list[str]:
    steps = client.job_steps(job_id)
    if steps:
        client.cancel(steps, signal="KILL")
    return steps


class PreflightWatch:
    """The in-rank preflight (``ddlaunch.health.gate``) seen from the batch host: print its
    verdicts into the batch log once the gate opens, and end the step when it has not decided
    within ``health.preflight_timeout`` (a node hung in the rendezvous or in ``import torch``:
    the end hook then judges from the node reports on disk)."""

    def __init__(self, run_dir: Path, job_id: str, restart: int, timeout: float | None) -> None:
        self.run_dir, self.job_id, self.restart, self.timeout = run_dir, job_id, restart, timeout
        self.done = timeout is None

    def poll(self, elapsed: float, client: Any) -> bool:
        """True when the step was ended because the preflight timed out."""
        if self.done:
            return False
        from ddlaunch.health import gate

        record = gate.read_gate(self.run_dir, self.job_id, self.restart)
        if record is not None:
            self.done = True
            if record.get("passed") and not record.get("printed"):
                self._print_passed(str(record.get("reason", "")))
                gate.mark_printed(self.run_dir, self.job_id, self.restart, record)
            return False
        assert self.timeout is not None
        if elapsed < self.timeout:
            return False
        self.done = True
        print(
            f"[ddlaunch watchdog] preflight undecided after {self.timeout:.0f} s "
            "(health.preflight_timeout): ending the step",
            flush=True,
        )
        if self.job_id:
            end_step(self.job_id, client)
        return True

    def _print_passed(self, reason: str) -> None:
        from ddlaunch.health import preflight
        from ddlaunch.health.hooks import read_reports

        reports = read_reports(preflight.reports_dir(self.run_dir, self.job_id, self.restart))
        for report in reports.values():
            if "checks" in report:
                print(preflight.summary_line(report), flush=True)
        print(f"[ddlaunch] preflight: {reason}", flush=True)


def failed_ranks(run_dir: Path, restart: int, not_before: float) -> list[float]:
    """Times of this attempt's rank failure records (``failures/rank-<R>.json``)."""
    times = []
    try:
        paths = list((run_dir / "failures").glob("rank-*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            rec = fsutil.read_json(path) or {}
        except (OSError, ValueError):
            continue
        when = float(rec.get("time") or 0.0)
        if int(rec.get("attempt") or 0) == restart and when >= not_before:
            times.append(when)
    return times


class NodeFailureWatch:
    """A node that died under the attempt, found from the batch host before Slurm marks it
    DOWN: said in the batch log with its time, not acted on.

    Trigger: ranks of this attempt failed (a peer's connection closed) and srun has not
    returned ``grace`` seconds later, because it waits for tasks on a node that no longer
    answers; or some ranks' heartbeats went stale while others' did not (a node that vanished
    without closing its connections). Then the nodes are probed as the end hook does
    (``jobhooks.blame_nodes``: Slurm's node state, a TCP connect to slurmd of the nodes whose
    ranks went silent).

    Why not end the attempt and requeue at once (measured on the dev cluster, Slurm 22.05):
    a requeued job stays COMPLETING until Slurm declares the dead node DOWN, so it cannot
    start earlier anyway (the only saving is Slurm's own post-requeue delay, the credential
    lifetime + 1 s); and a GPU job requeued while one of its nodes does not respond comes
    back with a broken gres allocation ("srun: error: Unable to create step ... Invalid
    generic resource (gres) specification"; slurmctld: "_step_get_gres_cnt ... node offset
    invalid"), so its next attempt fails at once. Slurm's own requeue at DOWN is not
    affected. Ending srun early (``scancel`` of the step blocks for MessageTimeout while
    the node does not answer) would only lead the end hook into that requeue."""

    def __init__(
        self,
        run_dir: Path,
        restart: int,
        not_before: float,
        ranks_per_node: int,
        nodelist: str,
        grace: float = 2.0,
        probe_every: float = 5.0,
    ) -> None:
        self.run_dir, self.restart, self.not_before = run_dir, restart, not_before
        self.ranks_per_node, self.nodelist = ranks_per_node, nodelist
        self.grace, self.probe_every = grace, probe_every
        self.last_probe = float("-inf")
        self.found: list[str] = []

    def triggered(self, now: float, beats: list[analysis.Beat], stale_after: float) -> bool:
        failures = failed_ranks(self.run_dir, self.restart, self.not_before)
        if failures and now - min(failures) >= self.grace:
            return True
        running = [b for b in beats if b.state == "running"]
        stale = [b for b in running if now - b.beat > stale_after]
        return bool(stale) and len(stale) < len(running)

    def pending(self) -> bool:
        """Ranks failed but srun is still running: poll again soon."""
        return bool(failed_ranks(self.run_dir, self.restart, self.not_before))

    def poll(
        self, now: float, beats: list[analysis.Beat], stale_after: float, client: Any
    ) -> tuple[list[str], str]:
        """(dead nodes, why); empty when nothing is found (or it is not time to probe)."""
        if not self.nodelist or not self.triggered(now, beats, stale_after):
            return [], ""
        if now - self.last_probe < self.probe_every:
            return [], ""
        self.last_probe = now
        from ddlaunch.jobhooks import blame_nodes

        current = {"nodes": self.nodelist}
        dead, why = blame_nodes(self.run_dir, current, client, self.ranks_per_node)
        self.found = dead
        return dead, why


def watch(
    run_dir: Path,
    *,
    job_id: str,
    restart: int,
    thresholds: analysis.Thresholds,
    expected_ranks: int | None,
    srun_pid: int | None,
    client: Any,
    clock: Any = time.time,
    sleep: Any = time.sleep,
    max_polls: int | None = None,
    preflight_timeout: float | None = None,
    heartbeats: bool = True,
    nodes: NodeFailureWatch | None = None,
) -> analysis.Finding | None:
    from ddlaunch.worker.heartbeat import read_heartbeats

    started = clock()
    state = analysis.StragglerState()
    last_step: int | None = None
    polls = 0
    gate = PreflightWatch(run_dir, job_id, restart, preflight_timeout)
    while srun_pid is None or alive(srun_pid):
        now = clock()
        if gate.poll(now - started, client):
            return None
        beats = (
            analysis.current_beats(read_heartbeats(run_dir), job_id, restart, started - 60)
            if heartbeats
            else []
        )
        if nodes is not None and not nodes.found:
            dead, why = nodes.poll(now, beats, thresholds.stale_after, client)
            if dead:
                # Said, not acted on: see NodeFailureWatch for why Slurm must requeue.
                print(
                    f"[ddlaunch watchdog] node failure: {why} ({now - started:.0f} s into the "
                    "attempt); Slurm requeues the job once it declares the node down",
                    flush=True,
                )
        if not heartbeats:
            polls += 1
            if max_polls is not None and polls >= max_polls:
                return None
            sleep(1.0)
            continue
        if beats and job_id:
            relay_deferred_signal(run_dir, job_id, restart, client)
        if beats:
            summary = analysis.summary(beats, now)
            summary.update({"job_id": job_id, "restart": restart})
            try:
                # No fsync: a summary for `status`, rewritten every poll.
                path = run_dir.joinpath(*WATCHDOG_FILE)
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(json.dumps(summary))
                os.replace(tmp, path)
            except OSError:
                pass
            if summary["step"] is not None and summary["step"] != last_step:
                last_step = summary["step"]
                append_sample(run_dir, summary)
            finding = analysis.analyse(beats, now, thresholds, state, expected_ranks)
            if finding is not None:
                record = {
                    "cause": finding.cause,
                    "nodes": list(finding.nodes),
                    "ranks": list(finding.ranks),
                    "detail": finding.detail,
                    "time": now,
                    "job_id": job_id,
                    "restart": restart,
                }
                fsutil.atomic_write_json(verdict_path(run_dir, job_id, restart), record, 0o600)
                print(f"[ddlaunch watchdog] {finding.cause}: {finding.detail}", flush=True)
                if job_id:
                    ended = end_step(job_id, client)
                    print(f"[ddlaunch watchdog] ended step(s) {', '.join(ended)}", flush=True)
                return finding
        polls += 1
        if max_polls is not None and polls >= max_polls:
            return None
        # Ranks failed while srun still runs: look again soon, a node may be gone.
        soon = nodes is not None and not nodes.found and nodes.pending()
        sleep(min(1.0, poll_period(thresholds)) if soon else poll_period(thresholds))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.health.watchdog")
    parser.add_argument("--srun-pid", type=int, required=True)
    args = parser.parse_args(argv)
    from ddlaunch.config import load_config
    from ddlaunch.slurm.client import SlurmClient

    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    cfg = load_config(run_dir / "config.yaml")
    h = cfg.health
    thresholds = analysis.Thresholds(
        hang_timeout=h.hang_timeout,
        heartbeat_interval=h.heartbeat_interval,
        straggler_factor=h.straggler_factor,
        straggler_patience=h.straggler_patience,
    )
    world = os.environ.get("DDLAUNCH_WORLD_SIZE", "")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    watch(
        run_dir,
        job_id=os.environ.get("SLURM_JOB_ID", ""),
        restart=restart,
        thresholds=thresholds,
        expected_ranks=int(world) if world.isdigit() else None,
        srun_pid=args.srun_pid,
        client=SlurmClient(),
        preflight_timeout=float(h.preflight_timeout) if h.preflight else None,
        heartbeats=h.watchdog,
        nodes=NodeFailureWatch(
            run_dir,
            restart,
            time.time() - 5,
            cfg.ranks_per_node,
            os.environ.get("SLURM_JOB_NODELIST", ""),
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
