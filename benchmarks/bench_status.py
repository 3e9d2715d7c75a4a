"""``ddlaunch status`` over 1000 array tasks beside one bare squeue call, in one run.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_status.py [--repeat 9]

Setup on the dev cluster (cleaned up afterwards, only the job ids submitted here are
cancelled): 3000 trivial held jobs, cancelled at once, so that the controller remembers
thousands of finished jobs (MinJobAge); 1000 held array tasks (ten arrays of 100: the dev
cluster's MaxArraySize is 101), each with its run directory, once as 1000 plain runs and once
as one sweep of 1000 members. Figures: median wall time of ``--repeat`` runs of each command,
each a fresh process; target: status <= 1.2 x squeue + 100 ms. ``ddlaunch --help`` and
``python -c 'import click'`` are printed as the floor every ddlaunch command pays (the
interpreter and the CLI library), and the first poll (no queued-run cache yet) beside the
later ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FINISHED_ARRAYS, ACTIVE_ARRAYS, TASKS = 30, 10, 100


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def submit_held(n: int, name: str, out: Path) -> list[str]:
    return [
        sh(
            "sbatch",
            "--parsable",
            "-H",
            f"--array=0-{TASKS - 1}",
            "-J",
            name,
            f"--output={out}/%A_%a.out",
            "--wrap",
            "true",
        )
        .strip()
        .split(";")[0]
        for _ in range(n)
    ]


def median_ms(argv: list[str], repeat: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stderr}")
    return statistics.median(times) * 1000


def make_runs(root: Path, arrays: list[str]) -> None:
    config = "cluster:\n  slurm_version: '22.05'\nstorage:\n  checkpoint_dir: null\n"
    for job in arrays:
        for task in range(TASKS):
            run = root / f"bench-{job}-{task}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(config)
            (run / "submission.json").write_text(json.dumps({"job_ids": [f"{job}_{task}"]}))


def make_sweep(root: Path, arrays: list[str]) -> str:
    sweep = root / "bench-sweep"
    members = []
    config = "cluster:\n  slurm_version: '22.05'\nstorage:\n  checkpoint_dir: null\n"
    i = 0
    for job in arrays:
        for task in range(TASKS):
            run = sweep / "members" / str(i)
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(config)
            (run / "submission.json").write_text(json.dumps({"job_ids": [f"{job}_{task}"]}))
            members.append({"index": i, "label": f"params.seed={i}"})
            i += 1
    (sweep / "members.json").write_text(json.dumps({"sweep_id": sweep.name, "members": members}))
    return sweep.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ddl-bench-status-"))
    submitted: list[str] = []
    try:
        finished = submit_held(FINISHED_ARRAYS, "ddl-bench-old", tmp)
        submitted += finished
        sh("scancel", *finished)
        active = submit_held(ACTIVE_ARRAYS, "ddl-bench-status", tmp)
        submitted += active
        runs_root, sweep_root = tmp / "runs", tmp / "sweeps"
        make_runs(runs_root, active)
        sweep_id = make_sweep(sweep_root, active)
        remembered = len(sh("squeue", "-h", "-r", "-t", "all", "-o", "%i").split())
        py = [sys.executable, "-m", "ddlaunch"]
        env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(runs_root), "COLUMNS": "160"}
        sweep_env = {**env, "DDLAUNCH_RUN_ROOT": str(sweep_root)}
        # The runs were submitted a while ago (their directories have settled); the first
        # poll reads every run directory and fills the queued-run cache, later polls stat.
        settled = time.time() - 60
        for path in [*runs_root.iterdir(), *(sweep_root / sweep_id / "members").iterdir()]:
            os.utime(path, (settled, settled))
        cold = median_ms([*py, "status"], 1, env)
        cold_sweep = median_ms([*py, "status", sweep_id], 1, sweep_env)
        figures = [
            ("squeue -h -o '%i %T'", median_ms(["squeue", "-h", "-o", "%i %T"], args.repeat, env)),
            ("ddlaunch status, first poll", cold),
            ("ddlaunch status (1000 runs)", median_ms([*py, "status"], args.repeat, env)),
            ("ddlaunch status --json", median_ms([*py, "status", "--json"], args.repeat, env)),
            ("ddlaunch status SWEEP, first", cold_sweep),
            (
                "ddlaunch status SWEEP (1000)",
                median_ms([*py, "status", sweep_id], args.repeat, sweep_env),
            ),
            ("ddlaunch --help (CLI floor)", median_ms([*py, "--help"], args.repeat, env)),
            (
                "python -c 'import click'",
                median_ms([sys.executable, "-c", "import click"], args.repeat, env),
            ),
            ("python -c pass", median_ms([sys.executable, "-c", "pass"], args.repeat, env)),
        ]
        base = figures[0][1]
        target = 1.2 * base + 100
        print(
            f"controller remembers {remembered} jobs; {ACTIVE_ARRAYS * TASKS} held array tasks "
            f"known to ddlaunch; median of {args.repeat}"
        )
        print(f"{'command':32} {'median':>9} {'bare squeue':>12} {'target':>9}")
        for name, ms in figures:
            verdict = (
                ""
                if name.startswith(("squeue", "python", "ddlaunch --help"))
                else "OK"
                if ms <= target
                else "SLOW"
            )
            print(f"{name:32} {ms:7.1f}ms {base:10.1f}ms {target:7.1f}ms  {verdict}")
    finally:
        if submitted:
            subprocess.run(["scancel", *submitted], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
