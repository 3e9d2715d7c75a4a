"""The login node's everyday verbs as whole processes, in two checkouts in the same run:
``ddlaunch --help``, and ``ddlaunch status`` over a run root of finished runs, beside the
floors they cannot go below (``python -c pass``; ``import click``).

    python benchmarks/bench_verbs.py [-n 21] [--runs 50] [--tree DIR]

``--tree DIR``: also time the ddlaunch of another checkout (e.g. ``git worktree add
/tmp/before <commit>``), interleaved with this one, and print each verb's ratio (this /
other, the median of the per-round ratios: the load of a shared machine drifts between
rounds, not within one). The run root holds ``--runs`` finished local runs (config, one
attempt, a COMPLETED outcome), written as a submit and a run leave them; Slurm is a directory
of stub commands on PATH that answer nothing, so a status that would ask it costs its
process start only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trees import resolved_config

REPO = Path(__file__).resolve().parent.parent
STUBS = ("sinfo", "scontrol", "sacct", "squeue", "sbatch", "scancel")


def stub_slurm(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)


def run_root(tree: Path, where: Path, runs: int) -> Path:
    """``runs`` finished runs of examples/mlp, the config resolved by the tree's own code."""
    config = resolved_config(tree)
    now = time.time()
    for i in range(runs):
        run = where / f"mlp-{i:04d}"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(config)
        start = now - 3600 + i
        attempt = {"attempt": 0, "job_id": f"local-{i:08x}", "start": start, "end": start + 30}
        attempt |= {"nodes": "localhost", "cause": "completed"}
        (run / "attempts.json").write_text(json.dumps([attempt]))
        (run / "outcome.json").write_text(json.dumps({"state": "COMPLETED", "time": start + 30}))
    return where


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=21)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tree", type=Path, default=None)
    args = parser.parse_args()
    trees = [REPO] + ([args.tree.resolve()] if args.tree else [])
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-verbs-") as tmp:
        base = Path(tmp)
        stub_slurm(base / "bin")
        path = f"{base / 'bin'}:{os.environ['PATH']}"
        roots = {t: run_root(t, base / f"root-{i}", args.runs) for i, t in enumerate(trees)}

        def env(tree: Path | None) -> dict[str, str]:
            out = {**os.environ, "PATH": path, "COLUMNS": "200"}
            out.pop("SLURM_CONF", None)
            if tree is not None:
                out["PYTHONPATH"] = str(tree)
                out["DDLAUNCH_RUN_ROOT"] = str(roots[tree])
                out["DDLAUNCH_BAD_NODES"] = str(base / "bad.json")
            return out

        verbs = {"--help": ["--help"], "status": ["status", "--all"]}
        floors = {
            "python -c pass": [python, "-c", "pass"],
            "import click": [python, "-c", "import click"],
        }
        times: dict[tuple[str, Path], list[float]] = {}
        floor_times: dict[str, list[float]] = {name: [] for name in floors}
        for _ in range(args.n):
            for name, argv in floors.items():
                floor_times[name].append(timed(argv, env(None), base))
            for verb, argv in verbs.items():
                for tree in trees:
                    command = [python, "-m", "ddlaunch", *argv]
                    times.setdefault((verb, tree), []).append(timed(command, env(tree), base))
        for name, values in floor_times.items():
            print(f"floor    {name:40} median {statistics.median(values) * 1000:6.0f} ms")
        for verb in verbs:
            for tree in trees:
                median = statistics.median(times[(verb, tree)])
                print(f"{verb:8} {tree!s:40} median {median * 1000:6.0f} ms over {args.n} runs")
            if args.tree:
                pairs = zip(times[(verb, REPO)], times[(verb, trees[1])], strict=True)
                ratio = statistics.median(a / b for a, b in pairs)
                print(f"{verb:8} ratio this/other (median of per-round ratios) {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
