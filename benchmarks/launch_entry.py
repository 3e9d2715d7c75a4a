"""Rank code for bench_launch.py: record when this rank reaches its first training step."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def first_step(config: object = None) -> None:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # the first collective: every rank is in the training loop now
    out = Path(os.environ.get("BENCH_OUT") or sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{dist.get_rank()}.t").write_text(repr(time.time()))
    dist.destroy_process_group()


if __name__ == "__main__":  # the hand-written baseline runs this file directly under srun
    os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
    os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
    first_step()
