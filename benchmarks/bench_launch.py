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


def run_ddlaunch(tmp: Path, i: int, *overrides: str) -> float:
    tag = f"ddl-{i}-{len(overrides)}"
    out = tmp / tag
    cfg = tmp / f"{tag}.yaml"
    cfg.write_text(CONFIG.format(here=HERE, out=out))
    extra = [arg for item in overrides for arg in ("--set", item)]
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(cfg), *extra, "--run-root", str(tmp)],
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"ddlaunch submit failed ({proc.returncode}): {proc.stderr}")
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
    rows: dict[str, list[float]] = {
        "hand-written sbatch + srun": [],
        "ddlaunch submit (default)": [],
        "ddlaunch submit, no preflight": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-launch-", dir=str(Path.home())) as tmp_name:
        tmp = Path(tmp_name)
        for i in range(args.n):  # interleaved so all three see the same machine load
            rows["hand-written sbatch + srun"].append(run_handwritten(tmp, i))
            rows["ddlaunch submit (default)"].append(run_ddlaunch(tmp, i))
            rows["ddlaunch submit, no preflight"].append(
                run_ddlaunch(tmp, i, "health.preflight=false")
            )
            time.sleep(2)
    base = statistics.median(rows["hand-written sbatch + srun"])
    print(f"{'submit -> all ranks at step 1':34} {'median':>8}  {'ratio':>6}  runs")
    for name, values in rows.items():
        med = statistics.median(values)
        runs = " ".join(f"{x:.2f}" for x in values)
        print(f"{name:34} {med:>7.2f}s  {med / base:>5.2f}x  {runs}")
    print(
        "target: ddlaunch <= 1.2x the hand-written script (preflight is a health check "
        "the hand-written script does not do)"
    )


if __name__ == "__main__":
    main()
