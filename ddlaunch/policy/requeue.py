"""Whether an attempt that ended gets another one: the one requeue policy (pure).

Blind retries mostly fail, so a crash is retried only if the committed step advanced during
the attempt (it made progress) and the cap is not reached. A signal-triggered stop of Session
code has just saved, so it passes the progress test by construction; it still counts. A stop
ddlaunch asked of another trainer is retried whatever its exit code, if the step advanced.
A node that failed preflight, hung or straggled is excluded before the retry, so that retry
is not blind either: it is allowed without the progress test (preflight runs before any step,
so it cannot show progress), within the cap. A health finding with no node to blame is
treated like a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# How an attempt ended.
CAUSE_COMPLETED = "completed"
CAUSE_SIGNAL = "signal"  # pre-timeout / preemption signal: saved, then requeued
CAUSE_CRASH = "crash"  # nonzero exit (exception, collective timeout, killed rank)
CAUSE_REQUEUED_BY_SLURM = "requeued by Slurm"  # node failure (or preemption) before any hook
CAUSE_NODE_FAILURE = "node failure"  # srun failed and Slurm reports a node of it as bad
# Kubernetes started the pods again before the leader pod concluded (its node died, the
# JobSet or PyTorchJob restarted them): recorded when the next attempt starts.
CAUSE_RESTARTED = "restarted by Kubernetes"
CAUSE_CANCELLED = "cancelled"
# ddlaunch asked a trainer it does not drive to stop (the pre-timeout signal forwarded by the
# batch shell, or trainer.stop_before_limit): requeued whatever the exit code (Megatron, NeMo
# and HF exit 0 after such a save), but only if the committed step advanced, since a trainer
# without a save-on-signal may never have checkpointed.
CAUSE_TRAINER_STOP = "trainer stop"
CAUSE_PREFLIGHT = "preflight"
CAUSE_HANG = "hang"
CAUSE_STRAGGLER = "straggler"
CAUSE_CHECKPOINT = "checkpoint save failed"  # on every rank together (a full disk)
HEALTH_CAUSES = (CAUSE_PREFLIGHT, CAUSE_HANG, CAUSE_STRAGGLER)

# The final states an outcome records.
COMPLETED, CANCELLED, STOPPED, FAILED = "COMPLETED", "CANCELLED", "STOPPED", "FAILED"


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
    blamed: Sequence[str] = (),
) -> Decision:
    """Requeue after an attempt that ended for ``cause``? ``blamed``: nodes a health check
    (preflight, hang, straggler) singled out and that the retry will exclude."""
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
    excluding = cause in HEALTH_CAUSES and bool(blamed)
    guarded = cause in (CAUSE_CRASH, CAUSE_NODE_FAILURE, CAUSE_TRAINER_STOP) or (
        cause in HEALTH_CAUSES and not excluding
    )
    progressed = committed_now is not None and (
        resumed_from is None or committed_now > resumed_from
    )
    if guarded and not progressed:
        since = (
            "no checkpoint was ever committed"
            if committed_now is None
            else f"the committed step stayed at {committed_now}"
        )
        return Decision(False, f"stopped: no progress in the last attempt ({since})")
    without = f", without {','.join(sorted(blamed))}" if excluding else ""
    if cause == CAUSE_PREFLIGHT and excluding:
        # No step ran, so "committed step a -> b" says nothing here.
        return Decision(True, f"requeue after preflight{without}")
    start = resumed_from if resumed_from is not None else "none"
    return Decision(
        True, f"requeue after {cause}: committed step {start} -> {committed_now}{without}"
    )


def final_state(cause: str) -> str:
    """The outcome's state for an attempt that was not requeued."""
    if cause == CAUSE_COMPLETED:
        return COMPLETED
    if cause == CAUSE_CANCELLED:
        return CANCELLED
    if cause in (CAUSE_SIGNAL, CAUSE_TRAINER_STOP):
        return STOPPED  # stopped for the time limit (saved), but no requeue is left
    return FAILED
