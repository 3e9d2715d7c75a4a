"""Rank code for bench_pipeline.py: a stage that records when its work ends, and a dependent
stage that records when it starts and when it reaches its first step.

Each function writes one JSON file into ``$BENCH_OUT`` (or ``argv[2]``): wall times from
``time.time()``, and the wall time at which this process was started (from
``/proc/self/stat``, 10 ms resolution) so that the rank's start-up can be told apart; the
dependent also records the CPU time its process had used by then.

    srun python pipeline_entry.py end|start OUT   # the hand-written chain's ranks
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def _out() -> Path:
    out = Path(os.environ.get("BENCH_OUT") or sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    return out


def _process_start() -> float:
    """Wall time at which this process started: its start in clock ticks since boot
    (``/proc/self/stat`` field 22) against CLOCK_BOOTTIME now."""
    stat = Path("/proc/self/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since


def _cpu() -> float:
    """CPU time this process has used so far (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _write(name: str, record: dict[str, float]) -> None:
    out = _out()
    tmp = out / f".{name}.json"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / f"{name}.json")


def stage_end(config: object = None) -> None:
    """The predecessor: one all-reduce of work, then the time its work ends, as it returns."""
    import torch
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    if created:
        dist.destroy_process_group()
    _write("end", {"process_start": _process_start(), "work_end": time.time()})


def stage_start(config: object = None) -> None:
    """The dependent: the time of its first action, then of its first step (past its first
    all-reduce, torch imported and the process group up, as a training loop would be)."""
    entered = time.time()
    cpu_entered = _cpu()
    import torch
    import torch.distributed as dist

    imported = time.time()
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    first_step = time.time()
    cpu_first_step = _cpu()
    if created:
        dist.destroy_process_group()
    _write(
        "start",
        {
            "process_start": _process_start(),
            "entered": entered,
            "imported": imported,
            "first_step": first_step,
            "cpu_entered": cpu_entered,
            "cpu_first_step": cpu_first_step,
        },
    )


if __name__ == "__main__":  # the hand-written chain runs this file directly under srun
    os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
    os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
    {"end": stage_end, "start": stage_start}[sys.argv[1]]()
