"""Benchmark submitting a 1000-member sweep, beside 1000 single sbatch calls and submitit.

    python benchmarks/bench_sweep.py [--members 1000] [--loop 1000] [--json]

Needs a Slurm cluster (the dev cluster: ``export SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf``).
In one run, all submitted *held* (``--hold``), so nothing starts, and cancelled by job id
right after each measurement:

  sbatch      one ``sbatch --hold`` of a trivial script (median of 5): the unit of cost;
  loop        ``--loop`` sequential sbatch calls, one job per member (the naive sweep);
  map_array   submitit's ``SlurmExecutor.map_array`` over the members, in chunks of the
              cluster's MaxArraySize (one call per chunk: larger arrays are refused);
  sweep       ``ddlaunch sweep`` of a sweep file with ``--members`` members, in process:
              expansion + validation + planning, the run directories, then the arrays.

Targets: the sweep costs at most 2x one sbatch call plus its expansion time (everything
before the first sbatch), and it is at least 20x faster than the loop.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout, without installing ddlaunch
    sys.path.insert(0, str(REPO))

TRIVIAL = "#!/bin/bash\ntrue\n"


def cancel(job_ids: list[str]) -> None:
    """scancel exactly these ids (never --user: other people's jobs share the cluster)."""
    for start in range(0, len(job_ids), 500):
        subprocess.run(["scancel", *job_ids[start : start + 500]], check=False, timeout=120)


def sbatch(script: Path, out: Path) -> str:
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            "-p",
            "debug",
            "-t",
            "1",
            f"--output={out}",
            str(script),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return proc.stdout.strip().split(";")[0]


def bench_single(tmp: Path, repeat: int = 5) -> float:
    script = tmp / "trivial.sh"
    script.write_text(TRIVIAL)
    times, ids = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        ids.append(sbatch(script, tmp / "single-%j.out"))
        times.append(time.perf_counter() - start)
    cancel(ids)
    return statistics.median(times)


def bench_loop(tmp: Path, count: int) -> float:
    script = tmp / "trivial.sh"
    script.write_text(TRIVIAL)
    ids: list[str] = []
    start = time.perf_counter()
    try:
        for _ in range(count):
            ids.append(sbatch(script, tmp / "loop-%j.out"))
        return time.perf_counter() - start
    finally:
        cancel(ids)


def _member(x: int) -> int:  # what map_array pickles: a stand-in for one member's run
    return x


def bench_map_array(tmp: Path, count: int, max_array: int) -> tuple[float, int]:
    import submitit

    executor = submitit.SlurmExecutor(folder=tmp / "submitit-%j")
    executor.update_parameters(
        partition="debug", time=1, array_parallelism=max_array, additional_parameters={"hold": True}
    )
    ids: list[str] = []
    chunks = [list(range(i, min(i + max_array, count))) for i in range(0, count, max_array)]
    start = time.perf_counter()
    try:
        for chunk in chunks:
            jobs = executor.map_array(_member, chunk)
            ids.append(jobs[0].job_id.split("_")[0])
        return time.perf_counter() - start, len(chunks)
    finally:
        cancel(ids)


def write_sweep(tmp: Path, members: int) -> Path:
    base = tmp / "base.yaml"
    base.write_text(
        "defaults: [examples/mlp]\n"
        "job: {name: bench-sweep, time: '00:05:00'}\n"
        "nodes: {count: 1, gpus_per_node: 1, cpus_per_task: 1}\n"
        "params: {steps: 20}\n"
    )
    seeds = members // 50 if members % 50 == 0 else None
    lines = ["base: base.yaml", "grid:"]
    if seeds:
        lrs = ", ".join(str(round(0.001 * (i + 1), 3)) for i in range(10))
        lines += [f"  params.lr: [{lrs}]", "  params.batch_size: [8, 16, 32, 64, 128]"]
        lines.append(f"seeds: {seeds}")
    else:
        lines.append(f"  params.trial: [{', '.join(map(str, range(members)))}]")
    path = tmp / "sweep.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def bench_sweep(tmp: Path, members: int) -> dict[str, Any]:
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.sweep import parse_sweep_file
    from ddlaunch.sweep_prepare import prepare_sweep
    from ddlaunch.sweep_slurm import probe_max_array_size
    from ddlaunch.sweep_submit import create_sweep_dir, submit_arrays

    spans: list[tuple[float, float]] = []

    class TimedClient(SlurmClient):
        """Records when each sbatch call ran (arrays are submitted concurrently)."""

        def sbatch(self, argv):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return super().sbatch(argv)
            finally:
                spans.append((start, time.perf_counter()))

    client = TimedClient()
    path = write_sweep(tmp, members)
    ids: list[str] = []
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        t0 = time.perf_counter()
        from ddlaunch.plan import ClusterFacts

        facts = ClusterFacts(max_array_size=probe_max_array_size(client))
        spec = parse_sweep_file(path)
        prepared = prepare_sweep(
            spec, workdir=str(tmp), facts=facts, run_root=str(tmp / "runs"), hold=True
        )
        t1 = time.perf_counter()
        sweep_dir = create_sweep_dir(prepared, client.runner, str(tmp))
        t2 = time.perf_counter()
        outcomes = submit_arrays(
            sweep_dir, prepared.arrays, prepared.sources, "python3", client, fresh=True
        )
        t3 = time.perf_counter()
        ids = [o.job_id for o in outcomes if o.job_id]
    finally:
        os.chdir(cwd)
        cancel(ids)
    assert len(ids) == len(outcomes), [o.error for o in outcomes if not o.job_id]
    assert sum(len(o.members) for o in outcomes) == members
    return {
        "total_s": t3 - t0,
        "prepare_s": t1 - t0,
        "run_dirs_s": t2 - t1,
        "submit_s": t3 - t2,
        # wall time during which at least one sbatch was running
        "sbatch_busy_s": union_length(spans),
        "arrays": len(outcomes),
        "max_array_size": facts.max_array_size,
    }


def union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--loop", type=int, default=1000, help="sbatch calls in the loop")
    parser.add_argument(
        "--dir",
        help="Where the run directories go (default: the system temp dir); nothing runs, so "
        "a node-local one such as /dev/shm shows the cost without the disk's metadata latency",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        sys.exit("bench_sweep: no sbatch on PATH (start the dev cluster, export SLURM_CONF)")
    tmp = Path(tempfile.mkdtemp(prefix="ddl-bench-sweep-", dir=args.dir))
    try:
        single = bench_single(tmp)
        sweep = bench_sweep(tmp, args.members)
        mapped, chunks = bench_map_array(tmp, args.members, sweep["max_array_size"] or 1000)
        loop = bench_loop(tmp, args.loop) * args.members / args.loop
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # "Expansion": everything the sweep does besides talking to Slurm (expansion, validation,
    # planning, run directories, pickles, records).
    expansion = sweep["total_s"] - sweep["sbatch_busy_s"]
    budget = 2 * single + expansion
    rows = {
        "one sbatch call (median of 5)": single,
        f"loop of {args.members} sbatch calls": loop,
        f"submitit map_array ({chunks} arrays)": mapped,
        f"ddlaunch sweep ({args.members} members, {sweep['arrays']} arrays)": sweep["total_s"],
    }
    result = {
        "rows_s": rows,
        "sweep_phases_s": {
            k: sweep[k] for k in ("prepare_s", "run_dirs_s", "submit_s", "sbatch_busy_s")
        },
        "sweep_vs_loop": loop / sweep["total_s"],
        "sweep_budget_s": budget,
        "ok_budget": sweep["total_s"] <= budget,
        "ok_vs_loop": loop / sweep["total_s"] >= 20,
        "loop_measured_calls": args.loop,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'what':52} {'wall':>9} {'per member':>11} {'loop / this':>12}")
    for name, secs in rows.items():
        per = "" if name.startswith("one") else f"{secs / args.members * 1000:9.2f}ms"
        ratio = "" if name.startswith("one") else f"{loop / secs:11.1f}x"
        print(f"{name:52} {secs:8.3f}s {per:>11} {ratio:>12}")
    print(
        f"  sweep phases: expansion+validation+plan {sweep['prepare_s']:.3f}s, run directories "
        f"{sweep['run_dirs_s']:.3f}s, pickles+sbatch+records {sweep['submit_s']:.3f}s, of which "
        f"sbatch running {sweep['sbatch_busy_s']:.3f}s ({sweep['arrays']} calls, concurrent)"
    )
    print(f"  run directories in {tmp.parent}")
    if args.loop != args.members:
        print(f"  (loop measured over {args.loop} calls, scaled to {args.members})")
    print(
        f"target 1: sweep <= 2 x sbatch + expansion ({expansion:.3f}s) = {budget:.3f}s: "
        f"{'OK' if result['ok_budget'] else 'MISSED'} ({sweep['total_s']:.3f}s)"
    )
    print(
        f"target 2: sweep >= 20x faster than the loop: "
        f"{'OK' if result['ok_vs_loop'] else 'MISSED'} ({result['sweep_vs_loop']:.1f}x)"
    )


if __name__ == "__main__":
    main()
