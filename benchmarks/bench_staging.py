"""Data staging on the dev cluster, in one run: the first staging of a 2 GB data set of 10,000
files beside a hand-rolled ``cp -a`` + ``sync``, the re-staging after a requeue beside the
first staging (target < 1 %), and reading every file per epoch from the staged copy beside the
shared path.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_staging.py \\
        [--files 10000] [--size-kb 200] [--epochs 2] [--no-cold]

One job of one rank on the first node: its leader stages ``--shared`` (created once, kept
for later runs) to ``<scratch>/{node}`` (emptied first) before the first step, the rank
measures the baseline and the reads (``benchmarks/staging_entry.py``), the benchmark sends
the pre-timeout signal, the ranks save and requeue, the next attempt on the same node stages
again (its source metadata evicted by the cold reads), once more (warm), and the job is
cancelled. Staging times are the node's staging records; the
filesystems are printed. Cold reads drop the page cache (root only) before each epoch.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def make_dataset(root: Path, files: int, size: int) -> None:
    marker = root.with_name(root.name + ".spec")  # beside it: not part of the data
    spec = f"{files} x {size}"
    if marker.exists() and marker.read_text() == spec:
        return
    shutil.rmtree(root, ignore_errors=True)
    for i in range(files):
        path = root / f"shard-{i % 100:02d}" / f"sample-{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    marker.write_text(spec)


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"no {what} after {timeout} s")


def staging_record(run_dir: Path, job: str, restart: int) -> dict | None:
    for path in (run_dir / "staging" / f"{job}-{restart}").glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("state") in ("done", "failed"):
            return record
    return None


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def filesystem(path: Path) -> str:
    device = sh("df", "--output=source,fstype", str(path)).splitlines()[-1].split()
    return f"{path}: {device[1]} on {device[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--size-kb", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--shared", default="/var/tmp/ddlaunch-bench-shared")
    parser.add_argument("--scratch", default="/var/tmp/ddlaunch-bench-scratch")
    args = parser.parse_args()
    shared, scratch = Path(args.shared), Path(args.scratch)
    made = time.perf_counter()
    make_dataset(shared, args.files, args.size_kb * 1000)
    print(f"data set: {args.files} files x {args.size_kb} KB in {shared} "
          f"(ready in {time.perf_counter() - made:.1f} s)")  # fmt: skip
    shutil.rmtree(scratch, ignore_errors=True)
    node = sh("sinfo", "-h", "-N", "-o", "%N").split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.yaml"
        config.write_text(
            f"""defaults: [clusters/devcluster]
job: {{name: bench-staging, time: "00:20:00"}}
nodes: {{count: 1, gpus_per_node: 1, nodelist: [{node}]}}
launch: {{entrypoint: "staging_entry:epochs", workdir: "{HERE}", backend: gloo}}
storage:
  scratch: {scratch}/{{node}}
  stage: [{{name: data, src: {shared}}}]
health: {{preflight_timeout: 600}}
fault_tolerance: {{checkpoint_every_steps: 1000000}}
params: {{epochs: {args.epochs}, cold: {str(not args.no_cold).lower()}}}
"""
        )
        env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(Path(tmp) / "runs"),
               "DDLAUNCH_BAD_NODES": str(Path(tmp) / "bad.json"),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "ddlaunch", "submit", str(config)],
            capture_output=True, text=True, env=env, check=True,
        ).stdout.split()  # fmt: skip
        run_dir, job = Path(tmp) / "runs" / out[1], out[3]
        try:
            first = wait_for(lambda: staging_record(run_dir, job, 0), 900, "first staging")
            read = wait_for(
                lambda: (
                    (run_dir / "bench-read.json").exists()
                    and json.loads((run_dir / "bench-read.json").read_text())
                ),
                1800,
                "read measurements",
            )
            restaged = []
            for restart in (1, 2):  # after the cold reads (caches dropped), then warm
                step = progress_step(run_dir)
                wait_for(lambda s=step: progress_step(run_dir) > s, 300, "training")
                sh("scancel", "--signal=USR2", job)  # the ranks save and requeue
                restaged.append(
                    wait_for(lambda r=restart: staging_record(run_dir, job, r), 900, "re-staging")
                )
        finally:
            subprocess.run(["scancel", job], check=False)
        report(args, shared, scratch, node, first, restaged, read)
    shutil.rmtree(scratch, ignore_errors=True)


def report(args, shared, scratch, node, first, restaged, read) -> None:  # type: ignore[no-untyped-def]
    print(filesystem(shared))
    print(filesystem(scratch))
    print("(on the dev cluster both are this machine's disk: node-local and shared alike)")
    a = first["items"][0]
    print(f"first staging on {node}: {a['seconds']:.2f} s, {a['bytes'] / 1e9:.2f} GB in "
          f"{a['files']} files ({a['bytes'] / 1e6 / a['seconds']:.0f} MB/s); baseline cp -a + "
          f"sync in the job: {read['baseline_cp_sync_s']:.2f} s "
          f"({a['seconds'] / read['baseline_cp_sync_s']:.2f}x)")  # fmt: skip
    whens = ("after the cold reads dropped the page cache", "the next requeue")
    for when, record in zip(whens, restaged, strict=True):
        b = record["items"][0]
        ratio = b["seconds"] / a["seconds"]
        verdict = "met" if ratio < 0.01 else "MISSED"
        print(f"re-staging after a requeue ({when}): {b['seconds'] * 1e3:.0f} ms, "
              f"{b['state']}, {b['bytes']} B copied = {100 * ratio:.2f} % of the first "
              f"staging (target < 1 %: {verdict})")  # fmt: skip
    for kind in ("warm", "cold"):
        runs = read.get(kind) or []
        if not runs:
            continue
        by = {s: [r["seconds"] for r in runs if r["from"] == s] for s in ("shared", "staged")}
        med = {s: statistics.median(v) for s, v in by.items() if v}
        if len(med) < 2:
            continue
        gb, staged, from_shared = runs[0]["bytes"] / 1e9, med["staged"], med["shared"]
        print(f"epoch read, {kind}: staged {staged:.2f} s ({gb / staged:.2f} GB/s), shared "
              f"{from_shared:.2f} s ({gb / from_shared:.2f} GB/s): {from_shared / staged:.2f}x "
              f"(median of {len(by['staged'])} epochs)")  # fmt: skip


if __name__ == "__main__":
    main()
