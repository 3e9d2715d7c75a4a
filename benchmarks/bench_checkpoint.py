"""Benchmark ddlaunch's sharded checkpoints against the disk, and async vs sync saves.

    python benchmarks/bench_checkpoint.py [--size-gib 1] [--ranks 4] [--matmuls 64] [--repeat 3]
        [--dir DIR] [--json]

(a) Throughput: ``--ranks`` gloo ranks on the CPU each save their shard of a ``--size-gib``
    state (DTensors sharded on dim 0) with CheckpointManager (DCP, fsync on, commit marker),
    beside ``--ranks`` parallel ``dd if=/dev/zero bs=1M conv=fsync`` streams of the same size
    in all into the same directory (one file per rank, as the save writes), and one dd
    stream. Best of ``--repeat`` each (interleaving is the caller's: the ranks start after
    the dd runs). Target: the save reaches >= 80% of the parallel dd's throughput. Also the
    CPU time of both (the save: every thread of every rank; dd: its processes), which a
    busy machine changes less than the wall times.
(b) Async stall: a training loop's visible stall from an async save, beside a synchronous
    save of the same state. The state is a model whose 8 parameters are those DTensor
    shards, updated by SGD. Each measurement is save() followed by the next training step
    (forward/backward on a small MLP, ``--matmuls`` layers, then ``optimizer.step()`` over
    the whole state); the stall is the time save() blocked plus the time the optimizer's
    step pre-hook waited for the background staging copy (slowest rank). Target: <= 5% of
    the sync save. Also shown: the same with the copy inside save() (``overlap_staging=
    False``), and how much longer the step with the save took than a plain step (CPU
    contention from the copy and writer threads included). "1st save, fresh run" is the
    first checkpoint work of the process, prepared as a Session prepares it: load_latest()
    (nothing to load) allocates and touches the staging buffers when the Session starts;
    "warm" is the save after it. "cold" is a manager used without load_latest or
    prepare_staging (not what a Session does): its first save allocates the buffers.

    How much compute hides the copy matters. A real step's forward/backward costs ~6 FLOPs
    per parameter per token, hundreds of times a copy of the parameters; the default work
    here (0.4-0.6 s of forward/backward with 4 ranks on a 2-core VM, where the background
    copy takes 0.25-0.4 s beside it) is a pessimistic stand-in. ``--matmuls 0`` is the
    worst case: the copy cannot overlap anything.

Everything is written under a fresh directory inside ``--dir`` and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
# The async measurements: (label, row title, note); "first" and "warm" have the target.
ASYNC_ROWS = (
    ("first", "1st save, fresh run", " (target <= 5%)"),
    ("warm", "warm", " (target <= 5%)"),
    ("cold", "cold (no load_latest)", ""),
    ("nooverlap", "warm, copy inside save()", " (no overlap)"),
    ("nooverlap_cold", "cold, copy inside save()", " (no overlap)"),
)
ASYNC_LABELS = tuple(label for label, _, _ in ASYNC_ROWS)
DEFAULT_MATMULS = 64  # forward/backward work per step: Linear(256, 256) layers, batch 256


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_dd(directory: Path, mib: int, streams: int = 1) -> tuple[float, float]:
    """Seconds (wall, CPU) for ``streams`` parallel dd processes to write ``mib`` MiB of
    zeros in all, each ending with an fsync (``conv=fsync``)."""
    targets = [directory / f"ddfile{i}" for i in range(streams)]
    count = mib // streams
    os.sync()  # do not make dd pay for other processes' dirty pages
    cpu = _cpu_s(resource.RUSAGE_CHILDREN)
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
    cpu = _cpu_s(resource.RUSAGE_CHILDREN) - cpu
    for target in targets:
        target.unlink(missing_ok=True)
    if any(codes):
        raise RuntimeError(f"dd failed: exit codes {codes}")
    return elapsed, cpu


class _StepWork:
    """A training step like a real loop's: forward/backward work on a small MLP (the same
    fixed amount every step), then ``optimizer.step()`` over the whole saved state."""

    def __init__(self, model: Any, optimizer: Any, matmuls: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(0)
        self.mlp = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(matmuls)))
        self.x = torch.randn(256, 256, generator=gen)
        self.optimizer = optimizer
        self.compute_s = 0.0  # the last step's forward/backward
        # The big parameters get a fixed gradient once: the step must update them all.
        for param in model.parameters():
            param.grad = torch.full_like(param, 1e-3)

    def __call__(self) -> None:
        start = time.perf_counter()
        if len(self.mlp):  # --matmuls 0: nothing between save() and the optimizer step
            self.mlp(self.x).square().mean().backward()  # stands in for forward/backward
        self.compute_s = time.perf_counter() - start
        self.optimizer.step()  # the step pre-hook waits here for a pending staging copy


def _time_background_copies(durations: list[float]) -> None:
    """Record how long each background staging copy takes (instrumentation only)."""
    from ddlaunch.saving import cpu_copy

    original = cpu_copy.copy_pairs

    def timed_copy(pairs: Any) -> None:
        start = time.perf_counter()
        original(pairs)
        durations.append(time.perf_counter() - start)

    cpu_copy.copy_pairs = timed_copy  # type: ignore[assignment]


def _rank_main(
    rank: int, world: int, port: int, bench_dir: str, shard_bytes: int, matmuls: int, repeat: int
) -> None:
    """One rank: sync saves, then async saves inside a step loop, rank 0 reports."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from ddlaunch.saving import CheckpointManager, TrainState

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    # A model-like state: 8 "layers", each a DTensor parameter whose dim-0 shard lives on
    # this rank, updated by SGD (no optimizer state: the parameters are the whole 1 GiB).
    rows = shard_bytes // (LAYERS * COLS * 4)
    model = torch.nn.Module()
    for i in range(LAYERS):
        local = torch.full((rows, COLS), float(rank * LAYERS + i))
        shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        model.register_parameter(f"layer{i}", torch.nn.Parameter(shard))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = {"train": TrainState(model, optimizer)}
    train_step = _StepWork(model, optimizer, matmuls)
    copies: list[float] = []
    _time_background_copies(copies)
    root = Path(bench_dir, "ckpt")
    results: dict[str, Any] = {"bytes_per_rank": rows * COLS * 4 * LAYERS}

    def slowest(seconds: float) -> float:
        # The next collective in training waits for the slowest rank.
        value = torch.tensor([seconds])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value)

    def timed(fn: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    def total(value: float) -> float:
        summed = torch.tensor([value])
        dist.all_reduce(summed)
        return float(summed)

    def clean() -> None:
        # Between measurements and outside the timings: keep the disk and page cache calm.
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
            os.sync()
        dist.barrier()

    def plain_steps(count: int) -> None:
        results["plain_step_s"], results["plain_compute_s"] = [], []
        for _ in range(count):
            dist.barrier()
            start = time.perf_counter()
            train_step()
            results["plain_step_s"].append(slowest(time.perf_counter() - start))
            results["plain_compute_s"].append(slowest(train_step.compute_s))

    plain_steps(5)

    def async_save(manager: CheckpointManager, label: str, step: int) -> None:
        """save(), then the next training step; the loop's stall is the time save() blocked
        plus the time the step's optimizer hook waited for the staging copy."""
        clean()
        dist.barrier()
        waited, copied = manager.staging_wait_s, len(copies)
        start = time.perf_counter()
        manager.save(step, state)
        save_s = time.perf_counter() - start
        train_step()
        step_s = time.perf_counter() - start
        hook_s = manager.staging_wait_s - waited
        results[f"async_{label}_save_s"] = slowest(save_s)
        results[f"async_{label}_hook_s"] = slowest(hook_s)
        results[f"async_{label}_stall_s"] = slowest(save_s + hook_s)
        results[f"async_{label}_step_s"] = slowest(step_s)  # save + the step after it
        results[f"async_{label}_compute_s"] = slowest(train_step.compute_s)
        results[f"async_{label}_copy_s"] = slowest(sum(copies[copied:]))
        results[f"async_{label}_total_s"] = step_s + timed(manager.wait)

    # A fresh run as a Session starts it (load_latest, which finds nothing and prepares
    # the staging buffers), then its first save: the first checkpoint work in this process.
    with CheckpointManager(root, keep_last=0, async_save=True) as async_manager:
        clean()
        results["load_latest_prepare_s"] = timed(lambda: async_manager.load_latest(state))
        async_save(async_manager, "first", 21)
        async_save(async_manager, "warm", 22)
    with CheckpointManager(root, keep_last=0) as sync_manager:
        results["sync_s"], results["sync_cpu_s"] = [], []
        for step in range(1, repeat + 1):
            clean()
            cpu = _cpu_s(resource.RUSAGE_SELF)  # every thread of this rank
            results["sync_s"].append(timed(lambda s=step: sync_manager.save(s, state)))
            results["sync_cpu_s"].append(total(_cpu_s(resource.RUSAGE_SELF) - cpu))
    # Cold: the first save allocates the staging buffers (no load_latest/prepare_staging).
    with CheckpointManager(root, keep_last=0, async_save=True) as async_manager:
        async_save(async_manager, "cold", 11)
    # The same, with the whole copy inside save() (the behaviour before issue #5).
    with CheckpointManager(
        root, keep_last=0, async_save=True, overlap_staging=False
    ) as async_manager:
        async_save(async_manager, "nooverlap_cold", 31)
        async_save(async_manager, "nooverlap", 32)
    clean()
    if rank == 0:
        Path(bench_dir, "result.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_ranks(
    world: int, bench_dir: Path, shard_bytes: int, matmuls: int, repeat: int
) -> dict[str, Any]:
    import torch.multiprocessing as mp

    # Fork ranks from a server that imported torch once (see tests/ckpt_dist.py).
    mp.set_forkserver_preload(["torch", "torch._dynamo", "ddlaunch.saving.manager"])
    mp.start_processes(
        _rank_main,
        args=(world, free_port(), str(bench_dir), shard_bytes, matmuls, repeat),
        nprocs=world,
        start_method="forkserver",
    )
    return json.loads((bench_dir / "result.json").read_text())


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def summarize(
    ranks: int,
    dd_mib: int,
    dd_runs: list[tuple[float, float]],
    dd_par_runs: list[tuple[float, float]],
    raw: dict[str, Any],
) -> dict[str, Any]:
    total = raw["bytes_per_rank"] * ranks
    sync_s = min(raw["sync_s"])  # best of --repeat, as for dd
    dd_s, dd_par_s = min(s for s, _ in dd_runs), min(s for s, _ in dd_par_runs)
    dd_mib_s = dd_mib / dd_s
    save_mib_s = total / MiB / sync_s
    plain_step_s = _median(raw["plain_step_s"])
    save_cpu_s = _median(raw["sync_cpu_s"])
    dd_par_cpu_s = _median([cpu for _, cpu in dd_par_runs])
    out: dict[str, Any] = {
        "size_gib": total / (1 << 30),
        "ranks": ranks,
        "dd_s": dd_s,
        "dd_runs_s": [s for s, _ in dd_runs],
        "dd_mib_s": dd_mib_s,
        "dd_parallel_streams": ranks,
        "dd_parallel_s": dd_par_s,
        "dd_parallel_runs_s": [s for s, _ in dd_par_runs],
        "dd_parallel_mib_s": dd_mib / dd_par_s,
        "dd_parallel_cpu_s": dd_par_cpu_s,
        "save_vs_dd_parallel": save_mib_s / (dd_mib / dd_par_s),
        "sync_save_s": sync_s,
        "sync_save_runs_s": raw["sync_s"],
        "sync_save_mib_s": save_mib_s,
        "sync_save_cpu_s": save_cpu_s,
        "sync_save_cpu_runs_s": raw["sync_cpu_s"],
        "save_cpu_vs_dd_parallel": save_cpu_s / dd_par_cpu_s,
        "save_vs_dd": save_mib_s / dd_mib_s,
        "plain_step_s": plain_step_s,
        "plain_compute_s": _median(raw["plain_compute_s"]),
        "load_latest_prepare_s": raw["load_latest_prepare_s"],
        "throughput_target_met": save_mib_s / (dd_mib / dd_par_s) >= THROUGHPUT_TARGET,
    }
    for label in ASYNC_LABELS:
        for part in ("save", "hook", "stall", "copy", "compute", "step", "total"):
            out[f"async_{label}_{part}_s"] = raw[f"async_{label}_{part}_s"]
        out[f"{label}_stall_vs_sync"] = raw[f"async_{label}_stall_s"] / sync_s
        # What the step that followed save() lost against a plain step, all causes together
        # (save, hook, and the copy and writer threads competing for the CPU).
        out[f"async_{label}_step_extra_s"] = raw[f"async_{label}_step_s"] - plain_step_s
    out["stall_target_met"] = max(out["first_stall_vs_sync"], out["warm_stall_vs_sync"]) <= (
        STALL_TARGET
    )
    return out


def print_table(r: dict[str, Any], directory: Path) -> None:
    print(f"sharded checkpoint: {r['size_gib']:.2f} GiB over {r['ranks']} ranks (gloo, CPU)")
    print(f"directory: {directory}")
    print(f"{'measurement':<34}{'seconds':>9}{'MiB/s':>9}  vs")
    par_label = f"dd x{r['ranks']} in parallel (reference)"
    print(f"{'dd bs=1M conv=fsync':<34}{r['dd_s']:>9.2f}{r['dd_mib_s']:>9.0f}")
    print(f"{par_label:<34}{r['dd_parallel_s']:>9.2f}{r['dd_parallel_mib_s']:>9.0f}")
    print(
        f"{'DCP sync save (fsync + commit)':<34}{r['sync_save_s']:>9.2f}"
        f"{r['sync_save_mib_s']:>9.0f}  {r['save_vs_dd_parallel']:.0%} of dd x{r['ranks']} "
        f"(target >= 80%), {r['save_vs_dd']:.0%} of dd"
    )
    print(
        f"CPU time: the save {r['sync_save_cpu_s']:.2f} s (all ranks' threads), "
        f"dd x{r['ranks']} {r['dd_parallel_cpu_s']:.2f} s: {r['save_cpu_vs_dd_parallel']:.2f}x"
    )
    print(
        f"training step without a save (median of 5): {r['plain_step_s']:.3f} s, "
        f"of which forward/backward {r['plain_compute_s']:.3f} s"
    )
    print("async save: stall = save() + wait in the optimizer's step hook (slowest rank);")
    print("  copy = background copy, fwd/bwd = the next step's, step+ = vs a plain step")
    print(
        f"{'async save':<26}{'stall':>7}{'save()':>8}{'hook':>7}{'copy':>7}{'fwd/bwd':>8}"
        f"{'step+':>7}  vs sync save"
    )
    for label, title, note in ASYNC_ROWS:
        cells = [
            r[f"async_{label}_{part}_s"] for part in ("stall", "save", "hook", "copy", "compute")
        ]
        print(
            f"{title:<26}{cells[0]:>7.3f}{cells[1]:>8.3f}{cells[2]:>7.3f}{cells[3]:>7.3f}"
            f"{cells[4]:>8.3f}{r[f'async_{label}_step_extra_s']:>7.3f}"
            f"  {r[f'{label}_stall_vs_sync']:.1%}{note}"
        )
    print(f"{'async save until committed, warm':<34}{r['async_warm_total_s']:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="total state size")
    parser.add_argument("--ranks", type=int, default=4, help="gloo ranks (processes)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument(
        "--matmuls",
        type=int,
        default=DEFAULT_MATMULS,
        help="forward/backward work per training step (256x256 layers of an MLP)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each dd and of the sync save (best)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    shard_bytes = int(args.size_gib * (1 << 30)) // args.ranks
    bench_dir = Path(tempfile.mkdtemp(prefix="ddlaunch-bench-ckpt-", dir=args.dir))
    try:
        rows = shard_bytes // (LAYERS * COLS * 4)
        dd_mib = rows * LAYERS * COLS * 4 * args.ranks // MiB  # what the ranks will save
        dd_runs, dd_par_runs = [], []
        for _ in range(args.repeat):
            dd_runs.append(run_dd(bench_dir, dd_mib))
            # One dd per rank, as the ranks write one file each in parallel: the baseline.
            dd_par_runs.append(run_dd(bench_dir, dd_mib, streams=args.ranks))
        raw = run_ranks(args.ranks, bench_dir, shard_bytes, args.matmuls, args.repeat)
    finally:
        shutil.rmtree(bench_dir, ignore_errors=True)
    result = summarize(args.ranks, dd_mib, dd_runs, dd_par_runs, raw)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
