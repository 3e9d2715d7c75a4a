"""How often a finished rank fails its run on the way out: N quick 2-node runs on the dev
cluster, each an entry point with 2 ranks per node that returns at once (the preflight's
process group kept for it, as for every entry point), counted by how each run ended and
whether any rank aborted at exit (srun's ``task N: Aborted``, a SIGABRT in the attribution).

    flock /tmp/ddlaunch-devcluster.lock python benchmarks/bench_exit.py [-n 50] [--tree DIR]

``--tree DIR`` runs the ddlaunch of another checkout (e.g. ``git worktree add /tmp/before
<commit>``), to measure the same thing before a change in the same session. The runs are
submitted at once and Slurm runs them as the cluster has room (back to back).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CONFIG = """defaults: [clusters/devcluster]
job: {{name: bench-exit, time: "00:05:00"}}
nodes: {{count: 2, gpus_per_node: 2, cpus_per_task: 1}}
launch: {{entrypoint: "launch_entrypoints:world_info", workdir: "{tests}", backend: gloo}}
"""

ABORT_MARKS = ("Aborted", "SIGABRT", "terminate called without an active exception")


def submit(tree: Path, config: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(config)],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise SystemExit(f"submit failed: {proc.stderr}")
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("run ") and "  job " in x]
    return line.split()[1]


def ended(run_dir: Path) -> str | None:
    try:
        return str(json.loads((run_dir / "outcome.json").read_text())["state"])
    except (OSError, ValueError, KeyError):
        return None


def aborted(run_dir: Path) -> bool:
    texts = [p.read_text(errors="replace") for p in (run_dir / "logs").glob("*")]
    return any(mark in text for text in texts for mark in ABORT_MARKS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="how many runs (default 50)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the ddlaunch checkout to run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for all runs")
    args = parser.parse_args()
    tree = args.tree.resolve()
    root = Path(tempfile.mkdtemp(prefix="ddl-bench-exit-"))
    env = {
        **os.environ,
        "SLURM_CONF": os.environ.get("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf"),
        "DDLAUNCH_RUN_ROOT": str(root / "runs"),
        "DDLAUNCH_BAD_NODES": str(root / "bad_nodes.json"),
    }
    config = root / "exit.yaml"
    config.write_text(CONFIG.format(tests=tree / "tests"))
    started = time.monotonic()
    runs = [submit(tree, config, env) for _ in range(args.n)]
    states: dict[str, str] = {}
    while len(states) < len(runs) and time.monotonic() - started < args.timeout:
        for run in runs:
            if run not in states and (state := ended(root / "runs" / run)) is not None:
                states[run] = state
        time.sleep(1)
    wall = time.monotonic() - started
    aborts = [run for run in runs if aborted(root / "runs" / run)]
    failed = [run for run, state in states.items() if state != "COMPLETED"]
    unfinished = [run for run in runs if run not in states]
    print(
        f"{args.n} runs of {tree}: {len(states) - len(failed)} COMPLETED, {len(failed)} not "
        f"({', '.join(sorted({states[r] for r in failed})) or '-'}), {len(unfinished)} "
        f"unfinished; {len(aborts)} with a rank aborted at exit; {wall:.0f} s; runs in {root}"
    )
    for run in sorted(set(failed) | set(aborts)):
        print(f"  {run}: {states.get(run)}{' (aborted)' if run in aborts else ''}")
    return 0 if not failed and not aborts and not unfinished else 1


if __name__ == "__main__":
    sys.exit(main())
