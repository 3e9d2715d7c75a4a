"""Benchmark ddlaunch's sharded checkpoints against the disk, and async vs sync saves.

    python benchmarks/bench_checkpoint.py [--size-gib 1] [--ranks 4] [--dir DIR] [--json]

(a) Throughput: ``--ranks`` gloo ranks on the CPU each save their shard of a ``--size-gib``
    state (DTensors sharded on dim 0) with CheckpointManager (DCP, fsync on, commit marker),
    beside ``dd if=/dev/zero bs=1M conv=fsync`` of the same size into the same directory.
    Target: the save reaches >= 80% of dd's throughput.
(b) Async stall: the time ``save()`` of an async manager blocks the training loop (staging a
    CPU copy and starting the writer thread), beside a synchronous save of the same state.
    Target: <= 5% of the sync save. The first async save also allocates the staging buffers,
    so it is reported separately ("cold"); later saves reuse them ("warm").

Everything is written under a fresh directory inside ``--dir`` and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout, without installing ddlaunch
    sys.path.insert(0, str(REPO))

MiB = 1 << 20
LAYERS, COLS = 8, 1024  # the state: 8 float32 "layers" of 1024 columns, rows sharded
THROUGHPUT_TARGET = 0.80
STALL_TARGET = 0.05


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_dd(directory: Path, mib: int, streams: int = 1) -> float:
    """Seconds for ``streams`` parallel dd processes to write ``mib`` MiB of zeros in all,
    each ending with an fsync (``conv=fsync``)."""
    targets = [directory / f"ddfile{i}" for i in range(streams)]
    count = mib // streams
    os.sync()  # do not make dd pay for other processes' dirty pages
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", "conv=fsync"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for target in targets
    ]
    codes = [proc.wait() for proc in procs]
    elapsed = time.perf_counter() - start
    for target in targets:
        target.unlink(missing_ok=True)
    if any(codes):
        raise RuntimeError(f"dd failed: exit codes {codes}")
    return elapsed


def _rank_main(rank: int, world: int, port: int, bench_dir: str, shard_bytes: int) -> None:
    """One rank: sync saves, then async saves, timed between barriers; rank 0 reports."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from ddlaunch.checkpoint import CheckpointManager

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    # A model-like state: 8 "layers", each a DTensor whose dim-0 shard lives on this rank.
    rows = shard_bytes // (LAYERS * COLS * 4)
    state = {
        f"layer{i}": DTensor.from_local(
            torch.full((rows, COLS), float(rank * LAYERS + i)), mesh, [Shard(0)], run_check=False
        )
        for i in range(LAYERS)
    }
    root = Path(bench_dir, "ckpt")
    results: dict[str, Any] = {"bytes_per_rank": rows * COLS * 4 * LAYERS}

    def timed(fn: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    def clean() -> None:
        # Between measurements and outside the timings: keep the disk and page cache calm.
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
            os.sync()
        dist.barrier()

    with CheckpointManager(root, keep_last=0) as sync_manager:
        results["sync_s"] = []
        for step in (1, 2):
            clean()
            results["sync_s"].append(timed(lambda s=step: sync_manager.save(s, state)))

    def async_save(manager: CheckpointManager, label: str, step: int) -> None:
        clean()
        dist.barrier()
        start = time.perf_counter()
        manager.save(step, state)
        stall = time.perf_counter() - start  # what the training loop waits for
        # The slowest rank's stall: the next collective in training waits for it.
        stall_t = torch.tensor([stall])
        dist.all_reduce(stall_t, op=dist.ReduceOp.MAX)
        results[f"async_{label}_stall_s"] = float(stall_t)
        results[f"async_{label}_total_s"] = stall + timed(manager.wait)

    # Cold: the first save allocates the staging buffers (no load_latest/prepare_staging).
    with CheckpointManager(root, keep_last=0, async_save=True) as async_manager:
        async_save(async_manager, "cold", 11)
        async_save(async_manager, "warm", 12)
    # As a training job runs it: load_latest (which prepares staging) before the loop.
    with CheckpointManager(root, keep_last=0, async_save=True) as async_manager:
        clean()
        results["load_latest_prepare_s"] = timed(lambda: async_manager.load_latest(state))
        async_save(async_manager, "first", 21)
    clean()
    if rank == 0:
        Path(bench_dir, "result.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_ranks(world: int, bench_dir: Path, shard_bytes: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    # Fork ranks from a server that imported torch once (see tests/ckpt_dist.py).
    mp.set_forkserver_preload(["torch", "torch._dynamo", "ddlaunch.checkpoint.manager"])
    mp.start_processes(
        _rank_main,
        args=(world, free_port(), str(bench_dir), shard_bytes),
        nprocs=world,
        start_method="forkserver",
    )
    return json.loads((bench_dir / "result.json").read_text())


def summarize(
    ranks: int, dd_mib: int, dd_s: float, dd_par_s: float, raw: dict[str, Any]
) -> dict[str, Any]:
    total = raw["bytes_per_rank"] * ranks
    sync_s = min(raw["sync_s"])  # best of two saves; dd gets one run (it varies less)
    dd_mib_s = dd_mib / dd_s
    save_mib_s = total / MiB / sync_s
    return {
        "size_gib": total / (1 << 30),
        "ranks": ranks,
        "dd_s": dd_s,
        "dd_mib_s": dd_mib_s,
        "dd_parallel_streams": ranks,
        "dd_parallel_s": dd_par_s,
        "dd_parallel_mib_s": dd_mib / dd_par_s,
        "save_vs_dd_parallel": save_mib_s / (dd_mib / dd_par_s),
        "sync_save_s": sync_s,
        "sync_save_runs_s": raw["sync_s"],
        "sync_save_mib_s": save_mib_s,
        "save_vs_dd": save_mib_s / dd_mib_s,
        "async_cold_stall_s": raw["async_cold_stall_s"],
        "async_warm_stall_s": raw["async_warm_stall_s"],
        "async_cold_total_s": raw["async_cold_total_s"],
        "async_warm_total_s": raw["async_warm_total_s"],
        "async_first_after_load_stall_s": raw["async_first_stall_s"],
        "load_latest_prepare_s": raw["load_latest_prepare_s"],
        "first_after_load_stall_vs_sync": raw["async_first_stall_s"] / sync_s,
        "warm_stall_vs_sync": raw["async_warm_stall_s"] / sync_s,
        "cold_stall_vs_sync": raw["async_cold_stall_s"] / sync_s,
        "throughput_target_met": save_mib_s / dd_mib_s >= THROUGHPUT_TARGET,
        "stall_target_met": raw["async_warm_stall_s"] / sync_s <= STALL_TARGET,
    }


def print_table(r: dict[str, Any], directory: Path) -> None:
    print(f"sharded checkpoint: {r['size_gib']:.2f} GiB over {r['ranks']} ranks (gloo, CPU)")
    print(f"directory: {directory}")
    print(f"{'measurement':<34}{'seconds':>9}{'MiB/s':>9}  vs")
    par_label = f"dd x{r['ranks']} in parallel (reference)"
    print(f"{'dd bs=1M conv=fsync':<34}{r['dd_s']:>9.2f}{r['dd_mib_s']:>9.0f}")
    print(f"{par_label:<34}{r['dd_parallel_s']:>9.2f}{r['dd_parallel_mib_s']:>9.0f}")
    print(
        f"{'DCP sync save (fsync + commit)':<34}{r['sync_save_s']:>9.2f}"
        f"{r['sync_save_mib_s']:>9.0f}  {r['save_vs_dd']:.0%} of dd (target >= 80%), "
        f"{r['save_vs_dd_parallel']:.0%} of dd x{r['ranks']}"
    )
    print(
        f"{'async save stall, warm':<34}{r['async_warm_stall_s']:>9.3f}{'':>9}"
        f"  {r['warm_stall_vs_sync']:.1%} of sync save (target <= 5%)"
    )
    print(
        f"{'async save stall, 1st after load':<34}"
        f"{r['async_first_after_load_stall_s']:>9.3f}{'':>9}"
        f"  {r['first_after_load_stall_vs_sync']:.1%} of sync save"
    )
    print(
        f"{'async save stall, cold (no load)':<34}{r['async_cold_stall_s']:>9.3f}{'':>9}"
        f"  {r['cold_stall_vs_sync']:.1%} of sync save"
    )
    print(f"{'async save until committed, warm':<34}{r['async_warm_total_s']:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="total state size")
    parser.add_argument("--ranks", type=int, default=4, help="gloo ranks (processes)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    shard_bytes = int(args.size_gib * (1 << 30)) // args.ranks
    bench_dir = Path(tempfile.mkdtemp(prefix="ddlaunch-bench-ckpt-", dir=args.dir))
    try:
        rows = shard_bytes // (LAYERS * COLS * 4)
        dd_mib = rows * LAYERS * COLS * 4 * args.ranks // MiB  # what the ranks will save
        dd_s = run_dd(bench_dir, dd_mib)
        # Reference only: one dd per rank, as the ranks write one file each in parallel.
        dd_par_s = run_dd(bench_dir, dd_mib, streams=args.ranks)
        raw = run_ranks(args.ranks, bench_dir, shard_bytes)
    finally:
        shutil.rmtree(bench_dir, ignore_errors=True)
    result = summarize(args.ranks, dd_mib, dd_s, dd_par_s, raw)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
