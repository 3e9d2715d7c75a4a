"""``render --target kubernetes`` of a 2,000-node config beside the sbatch render of the same
config, in one run.

    python benchmarks/bench_kubernetes_render.py [--repeat 21] [--nodes 2000]

Two figures, each the median of ``--repeat`` runs: the render in this process (config load,
validation, plan, manifest or script: what ``render`` does after its imports) and the whole
CLI command in a fresh interpreter (``ddlaunch render CONFIG [--target kubernetes]``).
Target: the Kubernetes render within 2x the sbatch render.
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

REPO = Path(__file__).resolve().parent.parent


def overrides(nodes: int) -> list[str]:
    return [
        f"nodes.count={nodes}",
        # One config for both targets: Slurm runs the image with pyxis, Kubernetes pulls it.
        "container.runtime=pyxis",
        "container.image=nvcr.io/nvidia/pytorch:24.05-py3",
        f"kubernetes.volumes={json.dumps({'/shared': 'pvc:shared-rwx'})}",
        "storage.run_root=/shared/runs",
    ]


def in_process(nodes: int, repeat: int) -> dict[str, float]:
    from ddlaunch.app.kubernetes import prepare_objects
    from ddlaunch.app.prepare import prepare

    sets = overrides(nodes)
    runs: dict[str, list[float]] = {"sbatch": [], "kubernetes": []}
    for _ in range(repeat):
        start = time.perf_counter()
        prepare("examples/mlp", sets, run_id="bench", workdir="/work")
        runs["sbatch"].append(time.perf_counter() - start)
        start = time.perf_counter()
        prepare_objects("examples/mlp", sets, run_id="bench", snapshot="skip", run_as=(1, 1))
        runs["kubernetes"].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1000 for k, v in runs.items()}


def cli(nodes: int, repeat: int) -> dict[str, float]:
    sets = [arg for s in overrides(nodes) for arg in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cwd = tempfile.mkdtemp(prefix="ddl-bench-")  # no git tree: no snapshot in either render
    base = [sys.executable, "-m", "ddlaunch", "render", "examples/mlp", *sets]
    runs: dict[str, list[float]] = {"sbatch": [], "kubernetes": []}
    for _ in range(repeat):
        for name, argv in (("sbatch", base), ("kubernetes", [*base, "--target", "kubernetes"])):
            start = time.perf_counter()
            subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
            runs[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1000 for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    for label, figures in (
        ("in process", in_process(args.nodes, args.repeat)),
        ("CLI", cli(args.nodes, args.repeat)),
    ):
        ratio = figures["kubernetes"] / figures["sbatch"]
        verdict = "met" if ratio <= 2 else "MISSED"
        print(
            f"{label}: render --target kubernetes {figures['kubernetes']:.1f} ms, sbatch render "
            f"{figures['sbatch']:.1f} ms ({args.nodes} nodes, median of {args.repeat}): "
            f"{ratio:.2f}x, target <= 2x {verdict}"
        )


if __name__ == "__main__":
    main()
