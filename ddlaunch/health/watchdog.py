"""The watchdog: ``python -m ddlaunch.health.watchdog --srun-pid PID`` (batch script, torch-free).

Runs in the background beside the training step on the batch host. Every few seconds it reads
the ranks' heartbeat files of this attempt, writes ``health/watchdog.json`` (a summary for
``status``) and asks ``analysis.analyse`` whether the attempt is hung or a node straggles. On
a finding it writes ``health/verdict-<job>-<restart>.json`` (cause, blamed nodes, detail) and
ends the training step with ``scancel --signal=KILL`` on it; srun then returns, and the end
hook (``jobhooks end``) reads the verdict, excludes the nodes and requeues through the usual
path. It exits when srun does. Inert for code that never beats (no ``Session``).
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
) -> analysis.Finding | None:
    from ddlaunch.worker.heartbeat import read_heartbeats

    started = clock()
    state = analysis.StragglerState()
    last_step: int | None = None
    polls = 0
    while srun_pid is None or alive(srun_pid):
        now = clock()
        beats = analysis.current_beats(read_heartbeats(run_dir), job_id, restart, started - 60)
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
        sleep(poll_period(thresholds))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.health.watchdog")
    parser.add_argument("--srun-pid", type=int, required=True)
    args = parser.parse_args(argv)
    from ddlaunch.config import load_config
    from ddlaunch.slurm.client import SlurmClient

    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    cfg = load_config(run_dir / "config.yaml")
    if not cfg.health.watchdog:
        return 0
    h = cfg.health
    thresholds = analysis.Thresholds(
        hang_timeout=h.hang_timeout,
        heartbeat_interval=h.heartbeat_interval,
        straggler_factor=h.straggler_factor,
        straggler_patience=h.straggler_patience,
    )
    world = os.environ.get("DDLAUNCH_WORLD_SIZE", "")
    watch(
        run_dir,
        job_id=os.environ.get("SLURM_JOB_ID", ""),
        restart=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        thresholds=thresholds,
        expected_ranks=int(world) if world.isdigit() else None,
        srun_pid=args.srun_pid,
        client=SlurmClient(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
