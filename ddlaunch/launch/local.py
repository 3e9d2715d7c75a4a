"""Run a job's ranks on this machine, through the same rank function as on Slurm.

Each rank is ``python -u -m ddlaunch.worker.task <run_dir>/submitit``, exactly the command
srun runs, with submitit's *local* job environment (``SUBMITIT_EXECUTOR=local`` and the
``SUBMITIT_LOCAL_*`` variables), so the task unpickles and calls ``run_rank`` as on Slurm
and leaves the same way (``ddlaunch.worker.leave``).

Why not ``submitit.LocalExecutor``: its controller writes each task's output to
``<folder>/<pid>_<k>_log.out`` (we need ``logs/rank-<R>.out/.err``, as srun writes them),
and waits for every task even after one failed, so the others stay blocked in a collective
until the timeout (srun's ``--kill-on-bad-exit`` ends them at once). Spawning the N
processes here gives both in a few lines, while the pickle and the in-task path stay
submitit's own.
"""

from __future__ import annotations

import math
import os
import pickle
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
from submitit.core.utils import JobPaths

import ddlaunch
from ddlaunch import fsutil
from ddlaunch.config import Config, load_config
from ddlaunch.errors import UserError
from ddlaunch.launch.slurm import rank_call
from ddlaunch.planning.ports import PORT_HIGH, PORT_LOW
from ddlaunch.rank_processes import Rank, Stopped, start_rank, stop_ranks
from ddlaunch.store.failures import Failure, read_failure
from ddlaunch.store.rundir import LOGS_DIR, SUBMITIT_DIR, config_path
from ddlaunch.store.snapshots import read_snapshot
from ddlaunch.worker.distenv import PORT_OVERRIDE_VAR

POLL_S = 0.05
# Like Slurm's KillWait: ranks treat SIGTERM as a stop request, SIGKILL follows.
KILL_GRACE_S = 2.0
# After Ctrl-C: time for the ranks to reach a step boundary and save (a second Ctrl-C kills).
INTERRUPT_GRACE_S = 60.0


class RanksInterrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, or SIGTERM) reached a local run and its ranks were stopped:
    ``interrupt``, the KeyboardInterrupt that arrived (``app.interrupts`` names its signal);
    ``ranks``, how ddlaunch then stopped the ranks (SIGTERM, SIGKILL after it), which is what
    the ranks' own logs say they received."""

    def __init__(self, interrupt: KeyboardInterrupt, ranks: Stopped) -> None:
        super().__init__(*interrupt.args)
        self.interrupt = interrupt
        self.ranks = ranks


class LocalRunError(UserError):
    """A local run failed or timed out; ``rank`` names the culprit when one is known."""

    exit_code = 1

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def free_local_port(tries: int = 64) -> int:
    """A rendezvous port for ranks on this machine: a random one below the ephemeral range
    (``planning.ports``: [16384, 32768)) that nothing holds now. Not the kernel's choice
    (binding port 0): that is an ephemeral port, which any outgoing connection on the
    machine may take as its local port between this check and the rank's own bind, and the
    rank then fails with EADDRINUSE; below the range only another explicit choice can take
    it. Not a hash of the run, as Slurm jobs use: two local runs or tests would share it."""
    for _ in range(tries):
        port = PORT_LOW + secrets.randbelow(PORT_HIGH - PORT_LOW)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # held, or in TIME_WAIT
            return port
    raise RuntimeError(f"no free port in [{PORT_LOW}, {PORT_HIGH}) after {tries} tries")


def _base_env(cfg: Config, run_dir: Path, job_id: str, world_size: int) -> dict[str, str]:
    # A --local run inside an salloc must not look like a Slurm step to submitit or to
    # distenv: drop inherited SLURM_* (and stale SUBMITIT_*) variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    env.update(cfg.launch.env)  # as in the batch script (fabric defaults are cluster-only)
    # The ranks must import this very ddlaunch (a checkout need not be installed), and the
    # code snapshot first, as on Slurm.
    package_root = str(Path(ddlaunch.__file__).resolve().parent.parent)
    snapshot = read_snapshot(run_dir)
    paths = (snapshot.path if snapshot else None, package_root, env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # N ranks on one machine: one intra-op thread each, as torchrun does.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault(PORT_OVERRIDE_VAR, str(free_local_port()))
    env.update(
        DDLAUNCH_RUN_DIR=str(run_dir),
        DDLAUNCH_RUN_ID=run_dir.name,
        DDLAUNCH_WORLD_SIZE=str(world_size),
        SUBMITIT_EXECUTOR="local",
        SUBMITIT_PREEMPT_SIGNAL=cfg.fault_tolerance.signal,
        SUBMITIT_LOCAL_JOB_ID=job_id,
        SUBMITIT_LOCAL_NTASKS=str(world_size),
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_LOCAL_NODEID="0",
    )
    return env


def _ranks_dir(run_dir: Path, cfg: Config) -> str:
    """The code snapshot's working directory when the run has one, else the live one."""
    snapshot = read_snapshot(run_dir)
    workdir = snapshot.workdir if snapshot else None
    if workdir and Path(workdir).is_dir():
        return str(workdir)
    return cfg.launch.workdir or os.getcwd()


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        return ""
    return lines[-1].strip() if lines else ""


def _describe_failure(run_dir: Path, job_id: str, rank: int, code: int | None) -> str:
    """One line naming the rank and its exception, from the failure record when there is one."""
    record = _failure_in(run_dir, job_id, rank)
    err_log = run_dir / LOGS_DIR / f"rank-{rank}.err"
    if record is not None:
        where = f" at {record.where}" if record.where else ""
        what = f"{record.exception}: {record.message}{where}"
    else:
        # Died before or outside the entry point (import error, segfault, OOM kill...).
        status = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit {code}"
        what = f"{status}; last stderr line: {_last_line(err_log) or '(empty)'}"
    return f"rank {rank} failed: {what} (log: {err_log})"


def _first_failure(run_dir: Path, job_id: str, ranks: list[int]) -> int:
    """The root cause among ranks seen failing in one poll: a peer of a failed rank often
    fails right after it (its collective loses a connection), so the earliest record wins."""

    def when(rank: int) -> float:
        record = _failure_in(run_dir, job_id, rank)
        return math.inf if record is None else record.time

    return min(ranks, key=lambda r: (when(r), r))


def _failure_in(run_dir: Path, job_id: str, rank: int) -> Failure | None:
    """The rank's failure record when it is of this local run (``job_id``)."""
    record = read_failure(run_dir, rank)
    return record if record is not None and record.job_id == job_id else None


def _read_result(folder: Path, job_id: str, rank: int) -> Any:
    with open(JobPaths(folder, job_id, rank).result_pickle, "rb") as handle:
        outcome, value = pickle.load(handle)
    if outcome != "success":
        raise LocalRunError(f"rank {rank} reported an error:\n{value}", rank)
    return value


def _interrupted(
    procs: list[Rank],
    told: Callable[[KeyboardInterrupt], None] | None,
    interrupt: KeyboardInterrupt,
) -> Stopped:
    """Ctrl-C: SIGTERM sets the ranks' stop flag, so they save at their next step boundary
    (as on a cancel) and leave; a second Ctrl-C kills them at once. Returns how they were
    stopped."""
    if told is not None:
        told(interrupt)
    running = sum(1 for p in procs if p.poll() is None)
    try:
        return stop_ranks(procs, INTERRUPT_GRACE_S)
    except KeyboardInterrupt:
        # The first stop was cut short: every rank running then got its SIGTERM.
        return Stopped(running, stop_ranks(procs, 0.0).killed)


def run_local(
    run_dir: Path,
    world_size: int,
    timeout_s: float,
    on_interrupt: Callable[[KeyboardInterrupt], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``world_size`` ranks of the run in ``run_dir`` here; per-rank results by rank.
    ``on_interrupt`` is called with the interrupt when Ctrl-C (or SIGTERM) arrives, before
    the ranks are asked to stop; ``RanksInterrupted`` then says how they were stopped."""
    run_dir = Path(run_dir).absolute()
    cfg = load_config(config_path(run_dir))
    # No "_" in the id: submitit reads JOB_TASK as an array job's identity.
    job_id = f"local-{secrets.token_hex(4)}"
    folder = run_dir / SUBMITIT_DIR
    delayed = rank_call(run_dir)
    delayed.set_timeout(max(1, math.ceil(timeout_s / 60)), 0)
    fsutil.atomic_write_bytes(
        JobPaths(folder, job_id).submitted_pickle, cloudpickle.dumps(delayed), 0o600
    )
    env = _base_env(cfg, run_dir, job_id, world_size)
    logs = run_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-u", "-m", "ddlaunch.worker.task", str(folder)]
    procs: list[Rank] = []
    failed: int | None = None
    try:
        for rank in range(world_size):
            rank_env = {
                **env,
                "SUBMITIT_LOCAL_GLOBALID": str(rank),
                "SUBMITIT_LOCAL_LOCALID": str(rank),
            }
            procs.append(start_rank(command, rank_env, logs, rank, cwd=_ranks_dir(run_dir, cfg)))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = _first_failure(run_dir, job_id, bad)
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise LocalRunError(
                    f"local run timed out after {timeout_s:g} s; ranks still "
                    f"running: {running} (logs: {logs})"
                )
            time.sleep(POLL_S)
    except KeyboardInterrupt as exc:
        raise RanksInterrupted(exc, _interrupted(procs, on_interrupt, exc)) from exc
    finally:
        # kill-on-bad-exit, timeout, Ctrl-C: never leave ranks behind
        stop_ranks(procs, KILL_GRACE_S)
    if failed is not None:
        message = _describe_failure(run_dir, job_id, failed, procs[failed].returncode)
        others = [
            r
            for r in range(world_size)
            if r != failed and _failure_in(run_dir, job_id, r) is not None
        ]
        if others:
            message += f"; ranks {others} failed too"
        raise LocalRunError(message, failed)
    return [_read_result(folder, job_id, rank) for rank in range(world_size)]
