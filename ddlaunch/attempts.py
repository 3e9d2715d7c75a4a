"""Attempts of a run and the requeue decision.

Every start of the batch script is an attempt (the first submission, each requeue). The
record lives in ``<run_dir>/attempts.json``: when it started, on which nodes, from which
committed step it resumed, and how and why it ended. ``decide`` is the pure policy:
requeue only while training makes progress and attempts remain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil

ATTEMPTS_FILE = "attempts.json"
OUTCOME_FILE = "outcome.json"
CANCEL_FILE = "cancel.json"  # written by `ddlaunch cancel` before it calls scancel

# How an attempt ended.
CAUSE_COMPLETED = "completed"
CAUSE_SIGNAL = "signal"  # pre-timeout / preemption signal: saved, then requeued
CAUSE_CRASH = "crash"  # nonzero exit (exception, collective timeout, killed rank)
CAUSE_REQUEUED_BY_SLURM = "requeued by Slurm"  # node failure (or preemption) before any hook
CAUSE_NODE_FAILURE = "node failure"  # srun failed and Slurm reports a node of it as bad
CAUSE_CANCELLED = "cancelled"


@dataclass(frozen=True)
class Decision:
    requeue: bool
    reason: str


def decide(
    *,
    cause: str,
    committed_now: int | None,
    resumed_from: int | None,
    requeues_so_far: int,
    max_requeues: int,
) -> Decision:
    """Whether to requeue after an attempt ended for ``cause``.

    Blind retries mostly fail, so a crash is retried only if the committed step advanced
    during the attempt (it made progress) and the cap is not reached. A signal-triggered stop
    has just saved, so it passes the progress test by construction; it still counts.
    """
    if cause == CAUSE_COMPLETED:
        return Decision(False, "completed")
    if cause == CAUSE_CANCELLED:
        return Decision(False, "cancelled by the user")
    if requeues_so_far >= max_requeues:
        return Decision(
            False,
            f"stopped: {requeues_so_far} requeues reached "
            f"fault_tolerance.max_requeues={max_requeues}",
        )
    progressed = committed_now is not None and (
        resumed_from is None or committed_now > resumed_from
    )
    if cause in (CAUSE_CRASH, CAUSE_NODE_FAILURE) and not progressed:
        since = (
            "no checkpoint was ever committed"
            if committed_now is None
            else f"the committed step stayed at {committed_now}"
        )
        return Decision(False, f"stopped: no progress in the last attempt ({since})")
    return Decision(
        True,
        f"requeue after {cause}: committed step "
        f"{resumed_from if resumed_from is not None else 'none'} -> "
        f"{committed_now}",
    )


def load(run_dir: Path) -> list[dict[str, Any]]:
    return list(fsutil.read_json(run_dir / ATTEMPTS_FILE, []) or [])


def save(run_dir: Path, attempts: list[dict[str, Any]]) -> None:
    fsutil.atomic_write_json(run_dir / ATTEMPTS_FILE, attempts, 0o600)


def end_last(run_dir: Path, *, cause: str, committed_step: int | None, **extra: Any) -> None:
    """Close the newest open attempt (no-op if it is closed already)."""
    attempts = load(run_dir)
    if not attempts or "end" in attempts[-1]:
        return
    attempts[-1].update(
        {"end": time.time(), "cause": cause, "committed_step": committed_step, **extra}
    )
    save(run_dir, attempts)


def cancel_reason(run_dir: Path, job_id: str | None = None, client: Any = None) -> str | None:
    """Why the run's job was cancelled, or None. ``ddlaunch cancel`` leaves CANCEL_FILE; a
    plain scancel is seen only in accounting (``client``'s sacct; measured on 22.05: CANCELLED
    there while squeue and scontrol say COMPLETING). Slurm sends the same SIGTERM at cancel
    and at preemption, and would requeue even a cancelled job, so a requeue asks this first."""
    if (run_dir / CANCEL_FILE).exists():
        return "cancelled with ddlaunch cancel"
    if not job_id or client is None:
        return None
    try:
        row = client.accounting_rows([job_id]).get(job_id)
    except Exception:  # no accounting, or Slurm unreachable: not known to be cancelled
        return None
    return "cancelled (scancel)" if row and row.state.startswith("CANCELLED") else None


def write_outcome(run_dir: Path, state: str, reason: str) -> None:
    fsutil.atomic_write_json(
        run_dir / OUTCOME_FILE, {"state": state, "reason": reason, "time": time.time()}, 0o600
    )
