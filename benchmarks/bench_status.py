"""``ddlaunch status`` over 1000 array tasks beside one bare squeue call, and over a run root
of months of use (10,000 finished runs and 10 queued) beside the same poll by an earlier
ddlaunch, in one run.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_status.py \
        [--repeat 9] [--runs 10000] [--baseline CHECKOUT]

``--baseline``: a source checkout of the ddlaunch to compare with (e.g. ``git worktree add
/tmp/base 6538e16``); its ``status`` runs on the same run root (PYTHONPATH=CHECKOUT).

Setup on the dev cluster (cleaned up afterwards, only the job ids submitted here are
cancelled): 3000 trivial held jobs, cancelled at once, so that the controller remembers
thousands of finished jobs (MinJobAge); 1000 held array tasks (ten arrays of 100: the dev
cluster's MaxArraySize is 101), each with its run directory, once as 1000 plain runs and once
as one sweep of 1000 members. Figures: median wall time of ``--repeat`` runs of each command,
each a fresh process; target: status <= 1.2 x squeue + 100 ms. The history root: every
finished run as a real one leaves it (config, submission, intent, attempts, progress,
result, outcome, a committed checkpoint), ten of them queued; target: a poll <= 0.3 s, its
first poll (which reads every directory once and caches the final states) printed beside.
``ddlaunch --help`` and
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


def median_ms(argv: list[str], repeat: int, env: dict[str, str], cwd: str | None = None) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=cwd)
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
    config = "cluster:\n  slurm_version: '22.05'\nstorage:\n  checkpoint_dir: null\n"
    i = 0
    for job in arrays:
        for task in range(TASKS):
            run = sweep / "members" / str(i)
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(config)
            (run / "submission.json").write_text(json.dumps({"job_ids": [f"{job}_{task}"]}))
            i += 1
    # members.json as ddlaunch.sweeps.packing writes it (one axis of i seeds)
    members = {"layout": [0] * i, "axes": [[[f"params.seed={n}"] for n in range(i)]]}
    (sweep / "members.json").write_text(json.dumps({"sweep_id": sweep.name, "members": members}))
    return sweep.name


def make_history(root: Path, count: int, finished: list[str], queued: list[str]) -> None:
    """``count`` runs as finished runs leave their directories, months old (submitted 10 min
    apart), the last ``len(queued)`` of them still waiting in the queue."""
    config = "cluster:\n  slurm_version: '22.05'\nstorage:\n  checkpoint_dir: null\n"
    start = time.time() - 90 * 86400 - count * 600
    marker = {"format": 1, "step": 100, "world_size": 1, "num_shard_files": 1}
    for i in range(count):
        run = root / f"exp-{i:05d}-20260901-120000-{i:04x}"
        (run / "logs").mkdir(parents=True)
        when = start + i * 600
        waiting = i >= count - len(queued)
        job = queued[i - count] if waiting else f"{finished[i % len(finished)]}_{i % TASKS}"
        (run / "config.yaml").write_text(config)
        (run / "submission.json").write_text(json.dumps({"job_ids": [job], "submitted": when}))
        (run / "intent.json").write_text(json.dumps({"state": "submitted", "created": when}))
        if not waiting:
            step_dir = run / "checkpoints" / "step-100"
            step_dir.mkdir(parents=True)
            attempt = {"attempt": 0, "job_id": job, "nodes": "node1", "start": when + 5}
            attempt |= {"end": when + 300, "cause": "completed", "committed_step": 100}
            (run / "attempts.json").write_text(json.dumps([attempt]))
            (run / "progress.json").write_text(json.dumps({"step": 100, "time": when + 300}))
            (run / "result.json").write_text(json.dumps({"final_loss": 0.01}))
            (run / "outcome.json").write_text(json.dumps({"state": "COMPLETED"}))
            (step_dir / ".metadata").write_text("x")
            (step_dir / ".ddlaunch-commit.json").write_text(json.dumps({**marker, "time": when}))
        os.utime(run, (when, when))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--runs", type=int, default=10000, help="runs in the history root")
    parser.add_argument("--baseline", type=Path, help="checkout of the ddlaunch to compare with")
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
        history(args, tmp, finished, active, py, env)
    finally:
        if submitted:
            subprocess.run(["scancel", *submitted], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def history(
    args: argparse.Namespace,
    tmp: Path,
    finished: list[str],
    active: list[str],
    py: list[str],
    env: dict[str, str],
) -> None:
    """``status`` on a run root of months of use, beside the earlier ddlaunch's."""
    root = tmp / "history"
    queued = [f"{active[0]}_{t}" for t in range(10)]
    made = time.perf_counter()
    make_history(root, args.runs, finished, queued)
    made = time.perf_counter() - made
    henv = {**env, "DDLAUNCH_RUN_ROOT": str(root)}
    figures = [("ddlaunch status, first poll", median_ms([*py, "status"], 1, henv))]
    figures.append(("ddlaunch status", median_ms([*py, "status"], args.repeat, henv)))
    figures.append(
        ("ddlaunch status --json", median_ms([*py, "status", "--json"], args.repeat, henv))
    )
    if args.baseline is not None:
        # Run from the checkout: `python -m` puts the working directory first on sys.path.
        old = {**henv, "PYTHONPATH": str(args.baseline)}
        where = str(args.baseline)
        listed = subprocess.run(
            [*py, "status"], env=old, cwd=where, capture_output=True, text=True, check=True
        ).stdout
        assert len(listed.splitlines()) == args.runs + 1, "the baseline lists every run"
        figures.append(("baseline: ddlaunch status", median_ms([*py, "status"], 3, old, where)))
    target = 300.0
    print(
        f"\nhistory: {args.runs} runs under the run root ({args.runs - len(queued)} finished, "
        f"{len(queued)} queued; written in {made:.0f} s); median of {args.repeat} "
        f"(baseline: of 3, {args.baseline})"
    )
    base = figures[-1][1] if args.baseline is not None else None
    print(f"{'command':32} {'median':>9} {'baseline':>10} {'ratio':>7} {'target':>8}")
    for name, ms in figures:
        ratio = f"{base / ms:6.1f}x" if base and not name.startswith("baseline") else ""
        verdict = (
            ""
            if "first" in name or name.startswith("baseline")
            else ("OK" if ms <= target else "SLOW")
        )
        shown = f"{base:8.1f}ms" if base else "-"
        print(f"{name:32} {ms:7.1f}ms {shown:>10} {ratio:>7} {target:6.0f}ms  {verdict}")


if __name__ == "__main__":
    main()
