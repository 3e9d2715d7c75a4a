"""Slurm calls made while following a run: ``submit --follow`` beside ``status --watch``, one run.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_follow.py [--steps 400]

Submits the example MLP (2 nodes x 2 ranks, slowed by ``params.step_sleep`` so that it runs
for a couple of minutes) with ``--follow``, and runs ``ddlaunch status --watch RUN`` on the same
run meanwhile. Each process gets its own PATH with wrappers of ``squeue``, ``sacct``,
``scontrol``, ``sinfo`` and ``scancel`` that log every call (then run the real command), so the
figures are the commands each process really ran. Printed: run time, the calls of each, and
what a follower that asked squeue on every poll of the files (every 0.5 s) would have made.
Target: ``--follow`` makes no Slurm call beyond status's one squeue per >= 30 s.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

TOOLS = ("squeue", "sacct", "scontrol", "sinfo", "scancel")


def shims(directory: Path, log: Path) -> dict[str, str]:
    directory.mkdir(parents=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            sys.exit(f"{tool} not on PATH: is the dev cluster's Slurm installed?")
        (directory / tool).write_text(
            f'#!/bin/sh\necho {tool} $(date +%s.%N) >> {log}\nexec {real} "$@"\n'
        )
        (directory / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}", "NO_COLOR": "1"}


def calls(log: Path) -> list[tuple[str, float]]:
    if not log.exists():
        return []
    return [(line.split()[0], float(line.split()[1])) for line in log.read_text().splitlines()]


def min_gap(times: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return min(gaps) if gaps else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-sleep", type=float, default=0.25)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    config = work / "follow.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "defaults": ["examples/mlp"],
                "job": {"name": "bench-follow"},
                "launch": {"snapshot": "none"},
                "params": {"steps": args.steps, "step_sleep": args.step_sleep, "log_every": 50},
            }
        )
    )
    follow_env = shims(work / "bin-follow", work / "calls-follow")
    watch_env = shims(work / "bin-watch", work / "calls-watch")
    for env in (follow_env, watch_env):
        env["DDLAUNCH_RUN_ROOT"] = str(work / "runs")
    started = time.monotonic()
    follower = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", "submit", str(config), "--follow"],
        cwd=work,
        env=follow_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    first = follower.stdout.readline().split()  # "run <id>  job <jobid>"
    run_id, job_id = first[1], first[3]
    watcher = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", "status", "--watch", run_id],
        cwd=work,
        env=watch_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out, err = follower.communicate(timeout=1800)
    finally:
        watcher.terminate()
        watcher.wait()
        subprocess.run(["scancel", job_id], check=False)
    seconds = time.monotonic() - started
    followed, watched = calls(work / "calls-follow"), calls(work / "calls-watch")
    lines = out.count("\n")
    print(f"run {run_id} (job {job_id}): {seconds:.0f} s followed, exit {follower.returncode}")
    print(f"  {lines} lines streamed; {err.strip().splitlines()[-1] if err.strip() else ''}")
    print(f"{'process':<28}{'squeue':>7}{'sacct':>6}{'other':>6}{'min gap s':>10}")
    for name, made in (("submit --follow", followed), ("status --watch (baseline)", watched)):
        c = Counter(tool for tool, _ in made)
        other = sum(n for t, n in c.items() if t not in ("squeue", "sacct"))
        gap = min_gap([t for tool, t in made if tool == "squeue"])
        print(f"{name:<28}{c['squeue']:>7}{c['sacct']:>6}{other:>6}{gap:>10.1f}")
    print(f"{'squeue on every 0.5 s poll':<28}{int(seconds / 0.5):>7}")
    ratio = Counter(t for t, _ in followed)["squeue"] / max(len(watched), 1)
    print(f"--follow / status --watch Slurm calls: {ratio:.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
