"""Per-rank heartbeats: step, time and step duration, cheap enough to call every step.

The training loop calls ``Heartbeat.step(n, wait_s)`` at each step boundary: a lock and a few
additions in memory, no I/O. A daemon thread writes ``<run_dir>/health/heartbeat/rank-<R>.json``
every ``interval`` seconds (one small file per rank, overwritten by rename, never fsynced: a
lost heartbeat is harmless, an fsync storm from thousands of ranks is not). The watchdog reads
these files (see ``ddlaunch.policy.heartbeats``).

Why a thread: it keeps writing while the main thread is blocked, so the file tells apart a
process that is frozen (SIGSTOP, stuck in the kernel, holding the GIL: the file goes stale)
from one that is alive but stuck. When the main thread has not stepped for two intervals, the
thread also records where it is (``where``) and whether that is inside a torch collective
(``waiting``): ranks that wait for a peer are victims, the rank they wait for is the culprit.

Torch-free (the watchdog and tests import it without torch).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from typing import Any

from ddlaunch.store.heartbeats import heartbeat_path, write_heartbeat

# A main thread whose Python stack passes through one of these is waiting for its peers
# (a collective, DDP's gradient all-reduce inside backward, the step-boundary agreement).
WAIT_MARKERS = (
    "torch/distributed/",
    "torch/nn/parallel/",
    "torch/autograd/",
    "torch/_tensor.py",
    "torch/cuda/",
    "ddlaunch/worker/signals.py",
)


def describe_stack(frame: Any) -> tuple[str, bool]:
    """(innermost ``file:line in func``, whether the stack is inside a collective)."""
    where = ""
    waiting = False
    depth = 0
    while frame is not None and depth < 200:
        code = frame.f_code
        path = code.co_filename.replace("\\", "/")
        if not where:
            where = f"{path}:{frame.f_lineno} in {code.co_name}"
        if any(marker in path for marker in WAIT_MARKERS):
            waiting = True
        frame = frame.f_back
        depth += 1
    return where, waiting


class Heartbeat:
    """One rank's heartbeat. ``step`` on the main thread; ``start``/``stop`` around the loop."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        *,
        interval: float = 10.0,
        host: str | None = None,
        job_id: str | None = None,
        restart: int = 0,
        relaunch: int = 0,
    ) -> None:
        self.path = heartbeat_path(run_dir, rank)
        self.rank = rank
        self.interval = interval
        self.host = host or socket.gethostname()
        self.job_id = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", "")
        self.restart = restart
        self.relaunch = relaunch
        self.started = time.time()
        self._lock = threading.Lock()
        self._step: int | None = None
        self._step_wall: float | None = None
        self._last_mono: float | None = None
        self._n = 0
        self._sum_dt = 0.0
        self._sum_wait = 0.0
        self._last_window: tuple[float | None, float | None] = (None, None)
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = "running"

    # ------------------------------------------------------------ main thread, every step

    def step(self, step: int, wait_s: float = 0.0) -> None:
        """Record that ``step`` finished; ``wait_s`` is the time of it spent waiting for peers
        (the straggler analysis compares the rest, the busy time, across nodes)."""
        mono = time.monotonic()
        with self._lock:
            if self._last_mono is not None:
                self._sum_dt += mono - self._last_mono
                self._sum_wait += wait_s
                self._n += 1
            self._last_mono = mono
            self._step = step
            self._step_wall = time.time()

    # ------------------------------------------------------------ writer thread

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            if self._n:
                self._last_window = (
                    self._sum_dt / self._n,
                    (self._sum_dt - self._sum_wait) / self._n,
                )
                self._n, self._sum_dt, self._sum_wait = 0, 0.0, 0.0
            step_time, busy_time = self._last_window
            step, step_wall, last_mono = self._step, self._step_wall, self._last_mono
        record: dict[str, Any] = {
            "rank": self.rank,
            "host": self.host,
            "pid": os.getpid(),
            "job_id": self.job_id,
            "restart": self.restart,
            "relaunch": self.relaunch,
            "started": self.started,
            "state": self._state,
            "step": step,
            "step_wall": step_wall,
            "step_time": step_time,
            "busy_time": busy_time,
            "beat": time.time(),
        }
        since = time.monotonic() - (last_mono if last_mono is not None else 0.0)
        if self._state == "running" and (last_mono is None or since > 2 * self.interval):
            frame = sys._current_frames().get(self._main or -1)
            if frame is not None:
                record["where"], record["waiting"] = describe_stack(frame)
        return record

    def write(self) -> None:
        write_heartbeat(self.path, self.snapshot())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                self.write()

    def start(self) -> Heartbeat:
        with contextlib.suppress(OSError):
            self.write()
        self._thread = threading.Thread(target=self._run, name="ddlaunch-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, state: str = "closed") -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._state = state
        with contextlib.suppress(OSError):
            self.write()
