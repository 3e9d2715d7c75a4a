"""The CPU time of a call, for the tests that check how a cost grows (a ratio of two sizes).

CPU time, not wall: the shared pass's other workers hold the cores, and a wall time counts
the moments its process waited for one, unequally between two measurements (a ratio of 35x
against a bound of 30x was seen for a linear parse). The collector is off while timing: a
collection landing in one run would be charged to it."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def cpu_seconds(call: Callable[[], object], repeat: int = 5) -> float:
    """The least CPU time of ``repeat`` calls."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            began = time.process_time()
            call()
            best = min(best, time.process_time() - began)
    finally:
        gc.enable()
    return best
