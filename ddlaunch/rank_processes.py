"""Rank processes started by ddlaunch itself, where no srun does it: the local run
(``launch.local``) and a Kubernetes pod's entry (``job.pod``).

Each rank is started in a session of its own, so that stopping it also stops what it started
(data loader workers, a trainer's helpers): every signal goes to the rank's process group.
Stopping follows Slurm's own pattern (SIGTERM, ``KillWait``, SIGKILL): a rank takes SIGTERM
as a stop request and saves at its next step boundary, so the grace is the caller's choice
(how long a step may take where it runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: How often a stop looks whether the ranks have left.
POLL_S = 0.05

Rank = subprocess.Popen[bytes]


def start_rank(
    command: Sequence[str], env: Mapping[str, str], logs: Path, rank: int, cwd: str | None = None
) -> Rank:
    """Start one rank, its output appended to ``logs/rank-<rank>.out|err`` (as srun's
    ``--open-mode=append`` does: a rerun keeps the earlier output)."""
    with open(logs / f"rank-{rank}.out", "ab") as out, open(logs / f"rank-{rank}.err", "ab") as err:
        return subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own group: stopped with its children
        )


def signal_rank(proc: Rank, sig: int) -> None:
    """``sig`` to the rank's process group: the rank and whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def signal_running(procs: Sequence[Rank], sig: int) -> None:
    """``sig`` to the groups of the ranks still running."""
    for proc in procs:
        if proc.poll() is None:
            signal_rank(proc, sig)


@dataclass(frozen=True)
class Stopped:
    """How ranks were stopped: ``asked``, the ranks running that got SIGTERM (a stop
    request: they save at their next step and leave); ``killed``, those still running when
    SIGKILL came (past the grace)."""

    asked: int = 0
    killed: int = 0


def stop_ranks(procs: Sequence[Rank], grace_s: float) -> Stopped:
    """SIGTERM to the ranks still running, up to ``grace_s`` for them to leave, then SIGKILL
    to every rank's group (a rank that left may have left workers behind) and reap them."""
    asked = sum(1 for p in procs if p.poll() is None)
    signal_running(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    killed = sum(1 for p in procs if p.poll() is None)
    for proc in procs:
        signal_rank(proc, signal.SIGKILL)
        proc.wait()
    return Stopped(asked, killed)
