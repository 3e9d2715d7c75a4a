"""How a rank process leaves: the one exit path of every task that ddlaunch starts.

A rank whose work returned normally must never turn into a failed one on its way out. The
interpreter's native teardown can abort a finished rank: gloo's (and NCCL's) threads are
still joinable when the C++ static destructors run, and the process dies with SIGABRT
("terminate called without an active exception"), which srun reports as ``task N: Aborted``
and the end hook as a crash. Measured on the dev cluster before this exit path: 1 of 20
quick 2-node runs of an entry point that returns at once ended FAILED that way. It happens
with Session code and plain entry points (the preflight's process group is kept for them),
with trainers that never destroy their group (HF Trainer, Lightning), and with scripts.

So every task, whatever it ran, leaves the same way once its result is written:

1. ``leave_process_group``: every rank meets at a barrier (no peer is still inside a
   collective when another one's sockets close), then destroys its process group;
2. ``fast_exit``: Python's own exit work (non-daemon threads joined, ``atexit`` handlers
   such as loggers' flushes, the streams flushed), then ``os._exit``: no native destructors.

A rank that failed skips the barrier (its peers may never reach it) and leaves through
``fast_exit`` too, after the traceback the interpreter would print: its status is its own
error's (1, or ``sys.exit``'s code), never an abort in a destructor on the way out.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from datetime import timedelta
from typing import NoReturn

# Ranks that finished together meet within a moment; a peer that never comes is not waited
# for as long as a collective's own timeout (30 minutes by default).
BARRIER_TIMEOUT_S = 60.0


def leave_process_group(timeout_s: float = BARRIER_TIMEOUT_S) -> None:
    """Barrier, then destroy the default process group, if this process has one.

    A peer that failed meanwhile (or one that already left its group, which a trainer's own
    asymmetric teardown can do) makes the barrier fail or time out: this rank's work still
    succeeded, so that is said and the rank leaves all the same without touching the group
    again (a destroy could wait on the unfinished barrier; ``os._exit`` does not)."""
    if "torch" not in sys.modules:  # never imported: there can be no process group
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        work = dist.barrier(async_op=True)
        if work is not None:
            work.wait(timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # a peer is gone: its own failure is the run's cause
        print(
            f"[ddlaunch] leaving without the final barrier: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _shutdown_threads() -> None:
    """What the interpreter does first at exit, with its own function: the callbacks
    registered for it run (``concurrent.futures`` tells its idle workers to stop there; a
    plain join of a pool's worker would wait forever), then the non-daemon threads are
    joined."""
    shutdown = getattr(threading, "_shutdown", None)
    if callable(shutdown):
        shutdown()


def fast_exit(code: int) -> NoReturn:
    """Leave with ``code`` after Python's exit work but without the native teardown."""
    try:
        _shutdown_threads()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def exit_code(exc: SystemExit) -> int:
    """The status ``sys.exit(value)`` gives the process, as the interpreter computes it
    (None is 0, an int is itself, anything else is printed and is 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr, flush=True)
    return 1
