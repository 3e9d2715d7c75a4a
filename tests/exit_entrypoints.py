"""Functions a task pickle calls in ``tests/test_worker_leave.py``: each leaves the task in
one of the ways a rank's work can end (importable by the task process: ``tests/`` is on its
path)."""

from __future__ import annotations

import atexit
import concurrent.futures
import sys
import threading
import time
from pathlib import Path


def returns(value: object) -> object:
    return value


def raises(message: str) -> None:
    raise RuntimeError(message)


def exits(code: int) -> None:
    sys.exit(code)


def leaves_work_behind(out: str) -> str:
    """What a trainer leaves running when it returns: an idle thread pool, a non-daemon
    thread that is still writing, an exit handler (a logger's flush)."""
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(time.sleep, 0.01).result()

    def write_late() -> None:
        time.sleep(0.3)
        Path(out, "thread").write_text("done")

    threading.Thread(target=write_late).start()
    atexit.register(lambda: Path(out, "atexit").write_text("done"))
    return "returned"


def keeps_its_group(init_method: str, rank: int, world_size: int) -> int:
    """Join a gloo process group over loopback, all-reduce once, and return with the group
    still alive (as an entry point that keeps the preflight's group does)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    value = torch.ones(1)
    dist.all_reduce(value)
    return int(value.item())
