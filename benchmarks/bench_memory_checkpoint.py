"""The in-process restart's memory checkpoint (``saving.memory``) beside a DCP checkpoint on
disk, on RANKS local gloo ranks over loopback, a state of --size-gib in all (a model of
plain float32 tensors and SGD momentum, split evenly over the ranks).

Per rank, medians of --repeat rounds:

* save: the DCP save of the state to a fresh ``step-N`` directory (sync, fsynced by the
  manager's commit) beside what the memory checkpoint adds at the same save for the
  training loop (``capture``: this rank's copy into buffers allocated when the Session
  started, ``MemoryCheckpoint.prepare``); then, in the background, serialize it, send it to
  the peer on the "next node", receive the predecessor's. With ``--async-save`` the save is
  an async one and the copy is made from its staged copy on the staging thread: the loop's
  stall is then save() + capture();
* restore: rank 1 restarts as a replacement (no RAM copy): the state from its peer's RAM
  copy (``memory.restore``: the holder sends it, the others reload their own) beside every
  rank reading the checkpoint from disk (``CheckpointManager.load_latest``); the slowest
  rank's time.

    PYTHONPATH=. python benchmarks/bench_memory_checkpoint.py --size-gib 1 --ranks 4 \
        [--async-save]

The page cache holds what was just written, as it would on a node that wrote it; the figure
from disk is a floor for a parallel filesystem's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

RANKS_PER_NODE = 2  # the peer of rank r is r + 2: two "nodes" of two ranks for 4 ranks


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _slowest(seconds: float) -> float:
    """The slowest rank's time: a restore is done when every rank is."""
    import torch
    import torch.distributed as dist

    took = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


def rank_main(
    rank: int, world: int, port: int, root: str, size_gib: float, repeat: int, async_save: bool
) -> None:
    import torch
    import torch.distributed as dist

    from ddlaunch.saving import memory
    from ddlaunch.saving.manager import CheckpointManager, TrainState

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(RANKS_PER_NODE),
    )
    dist.init_process_group("gloo")
    per_rank = int(size_gib * 2**30 / world / 4 / 2)  # floats: weights + momentum
    width = 4096
    model = torch.nn.Sequential(
        *(torch.nn.Linear(width, width, bias=False) for _ in range(max(1, per_rank // width**2)))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # the momentum buffers exist
    state = {"train": TrainState(model, opt)}
    manager = CheckpointManager(root, keep_last=1, async_save=async_save)
    manager.load_latest(state)  # as a Session starts: prepares the async staging buffers
    copies = memory.MemoryCheckpoint(RANKS_PER_NODE)
    if hasattr(copies, "prepare"):  # the Session allocates the copies' buffers at start
        copies.prepare(state)
        copies.agree(state)  # and, at a fresh start, agrees that they fit
    # The copy from the async save's staged copy (where this version has it).
    extra = {"from_staging": manager.copy_staged} if hasattr(manager, "copy_staged") else {}
    saves, captures, arrived, from_ram, from_disk = [], [], [], [], []
    for step in range(repeat):
        dist.barrier()
        began = time.perf_counter()
        manager.save(step, state, {"step": step})
        saves.append(time.perf_counter() - began)
        if not async_save:
            dist.barrier()
            began = time.perf_counter()
        copies.capture(step, state, **extra)
        captures.append(time.perf_counter() - began)  # what the training loop waits for
        assert copies.pending is not None
        copies.pending[1].result()
        arrived.append(time.perf_counter() - began)  # the peer's copy, in the background
        manager.wait()  # async: the commit
        copies.commit(step)
        if rank == 1:
            memory.forget()  # the replacement: a new process, nothing in RAM
        dist.barrier()
        began = time.perf_counter()
        restored = memory.restore(state, step)
        from_ram.append(_slowest(time.perf_counter() - began))
        assert restored == step, restored
        dist.barrier()
        began = time.perf_counter()
        info = manager.load_latest(state)
        from_disk.append(_slowest(time.perf_counter() - began))
        assert info is not None and info.step == step
    if rank == 0:
        print(
            json.dumps(
                {
                    "state_mib_per_rank": round(memory.nbytes(memory.held().own) / 2**20, 1),  # type: ignore[union-attr]
                    "save_s": statistics.median(saves),
                    "capture_s": statistics.median(captures),
                    "arrived_s": statistics.median(arrived),
                    "restore_ram_s": statistics.median(from_ram),
                    "restore_disk_s": statistics.median(from_disk),
                }
            ),
            flush=True,
        )
    manager.close()
    dist.destroy_process_group()


def _rank_args(rank: int, port: int, root: str) -> list[str]:
    return ["--rank", str(rank), "--port", str(port), "--root", root]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--async-save", action="store_true", help="async saves (the copy from the staged one)"
    )
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--root", default="")
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(
            args.rank, args.ranks, args.port, args.root, args.size_gib, args.repeat, args.async_save
        )
        return
    root = tempfile.mkdtemp(prefix="bench-memory-", dir="/var/tmp")
    port = _port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:], *_rank_args(r, port, root)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(args.ranks)
    ]
    out = [p.communicate()[0] for p in procs]
    subprocess.run(["rm", "-rf", root], check=False)
    result = json.loads(out[0].strip().splitlines()[-1])
    print(f"{args.ranks} ranks, {result['state_mib_per_rank']} MiB of state each")
    if args.async_save:
        print(f"  async save: save() returned after   {result['save_s']:7.3f} s")
        print(f"  then save() + capture() stalled     {result['capture_s']:7.3f} s")
    else:
        print(f"  save to disk (DCP, sync)            {result['save_s']:7.3f} s")
        print(
            f"  memory checkpoint at the save       {result['capture_s']:7.3f} s "
            f"({result['capture_s'] / result['save_s']:.2f}x the save)"
        )
    print(f"  the peer's copy arrived (background) {result['arrived_s']:7.3f} s")
    print(f"  restore, a replacement from RAM     {result['restore_ram_s']:7.3f} s")
    print(f"  restore, every rank from disk       {result['restore_disk_s']:7.3f} s")
    print(
        f"  ratio disk / RAM                    "
        f"{result['restore_disk_s'] / result['restore_ram_s']:7.2f}x"
    )


if __name__ == "__main__":
    main()
