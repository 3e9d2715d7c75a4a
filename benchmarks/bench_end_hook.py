"""The batch host's end hook as a whole process: ``python -m ddlaunch.job.hooks end`` after
an attempt whose ranks completed, and after one that crashed (exit 1, nothing committed since
it began: the run stops), timed in two checkouts in the same run.

    python benchmarks/bench_end_hook.py [-n 21] [--tree DIR]

``--tree DIR`` also times the ddlaunch of another checkout (e.g. ``git worktree add
/tmp/before <commit>``) beside this one, runs interleaved, and prints the medians' ratio.
Slurm is a directory of stub commands on PATH that answer nothing and count their calls:
the hook's own cost, not the controller's.
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

from trees import resolved_config

REPO = Path(__file__).resolve().parent.parent
STUBS = ("sinfo", "scontrol", "sacct", "squeue", "srun", "scancel")


def stub_slurm(bin_dir: Path, calls: Path) -> None:
    bin_dir.mkdir(parents=True)
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        stub.chmod(0o755)


def template_run(tree: Path, where: Path) -> Path:
    """A run directory as submit leaves it (the resolved config of examples/mlp, written by
    the checkout's own ddlaunch), with step 20 committed and attempt 0 open since step 20."""
    run = where / "run"
    config = resolved_config(tree)
    step = run / "checkpoints" / "step-20"
    step.mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    (step / ".metadata").write_text("x")
    commit = {"format": 1, "step": 20, "time": 1.0, "world_size": 1, "num_shard_files": 1}
    (step / ".ddlaunch-commit.json").write_text(json.dumps(commit))
    record = {
        "attempt": 0,
        "job_id": "7",
        "restart_count": 0,
        "nodes": "node1",
        "batch_host": "node1",
        "start": time.time(),
        "resumed_from": 20,
    }
    (run / "attempts.json").write_text(json.dumps([record]))
    return run


def one_end(tree: Path, template: Path, exit_code: int, scratch: Path, path: str) -> float:
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(template, run)
    env = {
        **os.environ,
        "PATH": path,
        "PYTHONPATH": str(tree),
        "DDLAUNCH_RUN_DIR": str(run),
        "DDLAUNCH_BAD_NODES": str(scratch / "bad.json"),
        "SLURM_JOB_ID": "7",
        "SLURM_RESTART_COUNT": "0",
        "SLURM_JOB_NODELIST": "node1",
    }
    argv = [sys.executable, "-m", "ddlaunch.job.hooks", "end", "--exit-code", str(exit_code)]
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=scratch)
    took = time.perf_counter() - began
    if not (run / "outcome.json").exists():
        raise SystemExit(f"the end hook of {tree} concluded nothing: {done.stdout}{done.stderr}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=21)
    parser.add_argument("--tree", type=Path, default=None)
    args = parser.parse_args()
    trees = [REPO] + ([args.tree.resolve()] if args.tree else [])
    with tempfile.TemporaryDirectory(prefix="bench-end-hook-") as tmp:
        base = Path(tmp)
        calls = base / "calls.log"
        stub_slurm(base / "bin", calls)
        path = f"{base / 'bin'}:{os.environ['PATH']}"
        templates = {t: template_run(t, base / f"template-{i}") for i, t in enumerate(trees)}
        for ending, code in (("completed", 0), ("crashed", 1)):
            times: dict[Path, list[float]] = {t: [] for t in trees}
            commands: dict[Path, int] = {}
            for _ in range(args.n):
                for tree in trees:
                    calls.unlink(missing_ok=True)
                    times[tree].append(one_end(tree, templates[tree], code, base, path))
                    commands[tree] = len(calls.read_text().splitlines()) if calls.exists() else 0
            medians = {t: statistics.median(v) for t, v in times.items()}
            for tree in trees:
                print(
                    f"{ending:9} {tree!s:40} median {medians[tree] * 1000:6.0f} ms "
                    f"over {args.n} runs, {commands[tree]} Slurm commands"
                )
            if args.tree:
                print(f"{ending:9} ratio this/other {medians[REPO] / medians[trees[1]]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
