"""Heartbeats: each rank's step, time and step duration, one record per node on the shared
filesystem.

The training loop calls ``Heartbeat.step(n, wait_s)`` at each step boundary: a lock and a few
additions in memory, no I/O. A daemon thread in each rank writes the rank's record every
``interval`` seconds into a node-local directory (``/dev/shm``, else ``$TMPDIR``; overridden
by ``$DDLAUNCH_NODE_TMP``); the thread of the node's leader (local rank 0) then merges its
node's records, with the node's summary, into ``<run_dir>/health/heartbeat/node-<host>.jsonl``,
so the shared filesystem sees one write per node per interval, not one per rank
(``ddlaunch.store.heartbeats`` says why a file per node). The watchdog reads these files
(see ``ddlaunch.policy.heartbeats``).

A rank whose process froze stops rewriting its node-local record, so its beat in the node's
record goes stale as its own file did before; a leader that died stops the node's record, and
every rank of the node goes stale with it: the node looks dead, which it is to the job.
When a rank stops it writes its final state, and merges the node's record itself once its
leader has stopped (so that a rank that finishes last is still seen closed, not hung).

Why a thread: it keeps writing while the main thread is blocked, so the record tells apart a
process that is frozen (SIGSTOP, stuck in the kernel, holding the GIL: the record goes stale)
from one that is alive but stuck. When the main thread has not stepped for two intervals, the
thread also records where it is (``where``) and whether that is inside a torch collective
(``waiting``): ranks that wait for a peer are victims, the rank they wait for is the culprit.

Torch-free (the watchdog and tests import it without torch).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.heartbeats import (
    MERGE_LOCK,
    RankBeat,
    earlier_local_dirs,
    heartbeat_path,
    local_beats_dir,
    local_rank_path,
    node_heartbeat_path,
    read_local_beats,
    write_heartbeat,
    write_node_record,
)

RUNNING = "running"

# A main thread whose Python stack passes through one of these is waiting for its peers
# (a collective, DDP's gradient all-reduce inside backward, the step-boundary agreement).
WAIT_MARKERS = (
    "torch/distributed/",
    "torch/nn/parallel/",
    "torch/autograd/",
    "torch/_tensor.py",
    "torch/cuda/",
    "ddlaunch/worker/signals.py",
    # torchft's quorum, cross-group all-reduce and commit vote (replica groups) wait for the
    # other groups.
    "torchft/",
)


def node_tmp(environ: dict[str, str] | None = None) -> Path:
    """The node-local directory for the ranks' own records: ``$DDLAUNCH_NODE_TMP``, else
    ``/dev/shm`` (memory: a write costs no disk and no metadata server), else ``$TMPDIR``."""
    env = os.environ if environ is None else environ
    if env.get("DDLAUNCH_NODE_TMP"):
        return Path(env["DDLAUNCH_NODE_TMP"])
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(env.get("TMPDIR") or "/tmp")


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
        local_rank: int | None = None,
        local_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.rank = rank
        self.interval = interval
        self.host = host or socket.gethostname()
        self.job_id = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID", "")
        self.restart = restart
        self.relaunch = relaunch
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self.leader = local_rank == 0
        base = local_dir if local_dir is not None else node_tmp()
        self._node_tmp = base
        self._run_dir = run_dir
        self.local_dir = local_beats_dir(base, run_dir, self.host, self.job_id, restart, relaunch)
        self.local_path = local_rank_path(self.local_dir, rank)
        # The node's record in the run directory, written by the leader only.
        self.path = node_heartbeat_path(run_dir, self.host)
        self._old_layout = heartbeat_path(run_dir, rank)
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
        self._state = RUNNING

    @classmethod
    def for_attempt(
        cls, run_dir: str | os.PathLike[str], rank: int, interval: float, attempt: AttemptId
    ) -> Heartbeat:
        """The heartbeat of ``rank`` in ``attempt`` (its job, restart and relaunch)."""
        return cls(
            run_dir,
            rank,
            interval=interval,
            job_id=attempt.job_id,
            restart=attempt.restart,
            relaunch=attempt.relaunch,
        )

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

    def progress(self) -> None:
        """Record work that is not a training step (an evaluation batch of a trainer
        ddlaunch does not drive): the hang rule counts from it, as from a step (its time is
        the record's ``step_wall``), and no step time is counted."""
        with self._lock:
            self._step_wall = time.time()

    # ------------------------------------------------------------ writer thread

    def snapshot(self) -> RankBeat:
        with self._lock:
            if self._n:
                self._last_window = (
                    self._sum_dt / self._n,
                    (self._sum_dt - self._sum_wait) / self._n,
                )
                self._n, self._sum_dt, self._sum_wait = 0, 0.0, 0.0
            step_time, busy_time = self._last_window
            step, step_wall, last_mono = self._step, self._step_wall, self._last_mono
        record: RankBeat = {
            "rank": self.rank,
            "leader": self.leader,
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
        if self._state == RUNNING and (last_mono is None or since > 2 * self.interval):
            frame = sys._current_frames().get(self._main or -1)
            if frame is not None:
                record["where"], record["waiting"] = describe_stack(frame)
        return record

    def write(self) -> None:
        """This rank's record, node-local; the leader also merges the node's record."""
        write_heartbeat(self.local_path, self.snapshot())
        if self.leader:
            with self._merge_lock():
                self._merge(read_local_beats(self.local_dir))

    def _merge(self, ranks: list[RankBeat]) -> None:
        attempt = (self.job_id, self.restart, self.relaunch)
        write_node_record(self.path, self.host, attempt, time.time(), ranks)

    @contextlib.contextmanager
    def _merge_lock(self) -> Iterator[None]:
        # Node-local flock: a closing rank's merge and the leader's never interleave, so the
        # last merge written has read every record written before it.
        lock = self.local_dir / MERGE_LOCK
        try:
            handle = open(lock, "a")  # noqa: SIM115 (closed below)
        except FileNotFoundError:  # stopped before it started, or removed under it
            self.local_dir.mkdir(parents=True, exist_ok=True)
            handle = open(lock, "a")  # noqa: SIM115
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                self.write()

    def prepare(self) -> None:
        """Make the directories, once (not on every beat), and remove this rank's file of the
        per-rank layout (a run started by an earlier version), which every later watchdog
        cycle would otherwise read; the leader also removes its node's directories of this
        run's earlier attempts."""
        with contextlib.suppress(OSError):
            self.local_dir.mkdir(parents=True, exist_ok=True)
            if self.leader:
                self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            self._old_layout.unlink(missing_ok=True)
        if self.leader:  # an earlier attempt's directory, left by ranks that were killed
            for old in earlier_local_dirs(self._node_tmp, self._run_dir, self.host, self.local_dir):
                shutil.rmtree(old, ignore_errors=True)

    def start(self) -> Heartbeat:
        self.prepare()
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
            self._close()

    def _close(self) -> None:
        """The final record; merged by the leader, or by this rank once the leader stopped
        (nobody else would carry it to the shared filesystem). The last rank to stop removes
        the node-local directory."""
        with self._merge_lock():
            write_heartbeat(self.local_path, self.snapshot())
            ranks = read_local_beats(self.local_dir)
            leader_gone = not any(
                r.get("rank") != self.rank and r.get("state") == RUNNING and r.get("leader")
                for r in ranks
            )
            if self.leader or leader_gone:
                self._merge(ranks)
            if all(r.get("state") != RUNNING for r in ranks):
                shutil.rmtree(self.local_dir, ignore_errors=True)
