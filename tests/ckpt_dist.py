"""Run a function on N local gloo ranks (spawned processes) with a hard wall-clock limit.

Used by the checkpoint tests and the checkpoint benchmark. ``fn(rank, world_size, *args)``
must be importable by name (a module-level function), since children are spawned.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlaunch.launch.local import free_local_port


def _entry(
    rank: int,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    threads: int,
    args: tuple[Any, ...],
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # Ranks share few cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
    )
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 90.0,
    threads: int = 1,
    start_method: str = "forkserver",
) -> None:
    """Run ``fn`` on ``world_size`` ranks; re-raise a rank's exception; kill all on timeout.

    ``forkserver`` (default) gives each rank a fresh process like ``spawn`` (no inherited
    threads or process groups), but forks it from a server that imported torch and ``fn``'s
    module once: importing torch.distributed.checkpoint costs ~6 CPU-seconds per process,
    which with spawn dominated the tests on a 2-core machine (4 ranks: ~25 s vs ~3 s).
    """
    if start_method == "forkserver":
        # torch._dynamo is imported lazily by the first DTensor op (another ~2 s per rank).
        mp.set_forkserver_preload(["torch", "torch._dynamo", __name__, fn.__module__])
    context = mp.start_processes(
        _entry,
        args=(fn, world_size, free_local_port(), threads, args),
        nprocs=world_size,
        join=False,
        start_method=start_method,
    )
    deadline = time.monotonic() + timeout
    # join() raises ProcessRaisedException (and terminates the others) when a rank fails.
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            raise TimeoutError(f"{fn.__name__} on {world_size} ranks exceeded {timeout:.0f}s")
