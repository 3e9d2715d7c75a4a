"""Time from submission to every rank entering its first training step, on the dev cluster:
``ddlaunch submit`` beside a hand-written sbatch + srun script doing the same (median of N
each, alternating, in one run). Target: ddlaunch at most 1.2x the hand-written script.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_launch.py [-n 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANKS = 4

HANDWRITTEN = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \\
  WORLD_SIZE=$SLURM_NTASKS exec {python} -u {entry} {out}'
"""

CONFIG = """defaults: [clusters/devcluster]
job: {{name: bench-launch, time: "00:05:00"}}
nodes: {{count: 2, gpus_per_node: 2, cpus_per_task: 1}}
launch: {{entrypoint: "launch_entry:first_step", workdir: "{here}", backend: gloo,
         env: {{BENCH_OUT: "{out}"}}}}
"""


def wait_ranks(out: Path, timeout: float = 180) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = list(out.glob("rank-*.t"))
        if len(files) == RANKS:
            return max(float(p.read_text()) for p in files)
        time.sleep(0.05)
    raise TimeoutError(f"ranks did not all start: {out}")


def run_handwritten(tmp: Path, i: int) -> float:
    out = tmp / f"hand-{i}"
    script = tmp / f"hand-{i}.sbatch"
    script.write_text(
        HANDWRITTEN.format(python=sys.executable, entry=HERE / "launch_entry.py", out=out)
    )
    t0 = time.time()
    job = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp}/hand-{i}.log", str(script)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        return wait_ranks(out) - t0
    finally:
        subprocess.run(["scancel", job], check=False)


def run_ddlaunch(tmp: Path, i: int) -> float:
    out = tmp / f"ddl-{i}"
    cfg = tmp / f"ddl-{i}.yaml"
    cfg.write_text(CONFIG.format(here=HERE, out=out))
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--run-root", str(tmp / "runs")],
        check=True,
        capture_output=True,
        text=True,
    )
    job = proc.stdout.split()[3]
    try:
        return wait_ranks(out) - t0
    finally:
        subprocess.run(["scancel", job], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf")
    hand, ddl = [], []
    with tempfile.TemporaryDirectory(prefix="bench-launch-", dir=str(Path.home())) as tmp_name:
        tmp = Path(tmp_name)
        for i in range(args.n):  # alternate so both see the same machine load
            hand.append(run_handwritten(tmp, i))
            ddl.append(run_ddlaunch(tmp, i))
            time.sleep(2)
    h, d = statistics.median(hand), statistics.median(ddl)
    print(f"{'submit -> all ranks at step 1':34} {'median':>8} {'runs':>40}")
    print(f"{'hand-written sbatch + srun':34} {h:>7.2f}s  {' '.join(f'{x:.2f}' for x in hand)}")
    print(f"{'ddlaunch submit':34} {d:>7.2f}s  {' '.join(f'{x:.2f}' for x in ddl)}")
    print(f"ratio {d / h:.2f}x (target <= 1.2x)  {'OK' if d <= 1.2 * h else 'SLOW'}")


if __name__ == "__main__":
    main()
