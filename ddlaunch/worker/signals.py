"""The pre-timeout / preemption signal only sets a flag; ranks act on it at a step boundary.

Why a flag: submitit's own handler checkpoints on rank 0 only, inside the handler. A sharded
(DCP) save is a collective, so every rank must take part, at a point where all ranks are
between the same two steps. The handler therefore records the request and returns; the
training loop calls ``agreed()`` at a step boundary (an all-reduce of the flag), and all
ranks save together.

Ours wins over submitit's: submitit's ``process_job`` installs its handlers *before* it calls
the rank function, and ``run_rank`` calls ``install`` first thing, replacing them (on the
configured signal and on submitit's own, $SUBMITIT_PREEMPT_SIGNAL, when they differ).

SIGTERM: Slurm sends it at cancel, preemption and the time limit, then SIGKILL after
KillWait (GraceTime on preemption). submitit already makes SIGTERM a no-op for its tasks
(it only logs it); we go one step further and let it set the same flag, so a loop that polls
``agreed()`` can still save in the grace window. A rank that never polls keeps running until
the SIGKILL, exactly as under submitit.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

_requested: str | None = None  # the name of the first signal received


def _handler(signum: int, frame: FrameType | None) -> None:
    # Keep this trivial: no locks, no torch. os.write, not print: print() from a handler that
    # interrupted another print on the same stream raises "reentrant call".
    global _requested
    name = signal.Signals(signum).name
    if _requested is None:
        _requested = name
    os.write(2, f"[ddlaunch] received {name}: stop requested\n".encode())


def signal_number(signame: str) -> signal.Signals:
    """``USR2`` or ``SIGUSR2`` -> ``signal.SIGUSR2``."""
    name = signame.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {signame!r}") from None


def install(signame: str, *, also: Sequence[str] = ("TERM",)) -> list[str]:
    """Make ``signame`` and the ``also`` signals set the stop flag; returns their names.

    Must run in the main thread (a Python rule for signal handlers).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("signals.install must be called from the main thread")
    numbers = {signal_number(name) for name in (signame, *also)}
    for number in sorted(numbers):
        signal.signal(number, _handler)
    return [n.name for n in sorted(numbers)]


def restore_defaults(*names: str) -> None:
    """Give these signals their default action again (a trainer that is not ddlaunch's)."""
    for number in sorted({signal_number(name) for name in names}):
        signal.signal(number, signal.SIG_DFL)


def requested() -> bool:
    """Whether this rank received a stop signal (local view; use ``agreed`` to act on it)."""
    return _requested is not None


def reason() -> str | None:
    """The name of the first signal received, e.g. ``SIGUSR2``; None when none was."""
    return _requested


def reset() -> None:
    """Forget a received signal (after the loop acted on it; also for tests)."""
    global _requested
    _requested = None


def agreed(group: Any = None) -> bool:
    """True on every rank when any rank received a stop signal. A collective: call it at the
    same step boundary on every rank of ``group`` (default: the world)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if requested() else 0], dtype=torch.int32)
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend(group) == "nccl":
            flag = flag.cuda()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())
