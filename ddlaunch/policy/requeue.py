"""Whether an attempt that ended gets another one: the one requeue policy (pure).

Blind retries mostly fail, so a crash is retried only if the committed step advanced during
the attempt (it made progress) and the cap is not reached. A signal-triggered stop of Session
code has just saved, so it passes the progress test by construction; it still counts. A stop
ddlaunch asked of another trainer is retried whatever its exit code, if the step advanced.
A node that failed preflight, hung or straggled is excluded before the retry, so that retry
is not blind either: it is allowed without the progress test (preflight runs before any step,
so it cannot show progress), within the cap. A health finding with no node to blame is
treated like a crash.

A retry is a restart inside the allocation (a new srun step, seconds) rather than a requeue
(a trip through the queue) when the ranks failed on nodes that are all still usable: a crash,
or a hang or straggler verdict that blamed no node. A blamed node must be left out: inside the
allocation only where there is a node to take its place or the run may shrink
(``fault_tolerance.spare_nodes``, ``nodes.min``: the caller says ``replaceable``), else only a
new allocation can do it, and that retry stays a requeue. Restarts
count against ``max_restarts``, requeues against ``max_requeues``; the progress guard applies
to both alike. Once the restarts are used up, a requeue is the fallback within its own cap.
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
# Endings a new step in the same allocation can retry (when no node was blamed): the ranks
# failed, the nodes did not. A node failure ends the allocation without --no-kill; a preflight
# failure blames a node; a signal means the time is up.
RESTART_CAUSES = (CAUSE_CRASH, CAUSE_HANG, CAUSE_STRAGGLER)
# Endings with blamed nodes a new step can retry when the allocation has usable nodes without
# them (a hot spare, or the run may shrink): the node died, failed preflight, hung or straggled.
REPLACE_CAUSES = (CAUSE_NODE_FAILURE, CAUSE_PREFLIGHT, CAUSE_HANG, CAUSE_STRAGGLER)

# The final states an outcome records.
COMPLETED, CANCELLED, STOPPED, FAILED = "COMPLETED", "CANCELLED", "STOPPED", "FAILED"


@dataclass(frozen=True)
class Decision:
    requeue: bool
    reason: str
    restart: bool = False  # retry in the same allocation (a new srun step), not a requeue

    @property
    def retry(self) -> bool:
        return self.requeue or self.restart


def decide(
    *,
    cause: str,
    committed_now: int | None,
    resumed_from: int | None,
    requeues_so_far: int,
    max_requeues: int,
    blamed: Sequence[str] = (),
    restarts_so_far: int = 0,
    max_restarts: int = 0,
    replaceable: bool = False,
) -> Decision:
    """Retry after an attempt that ended for ``cause``, and how? ``blamed``: nodes a health
    check (preflight, hang, straggler) or a node failure singled out and that the retry will
    exclude. ``max_restarts``: restarts inside the allocation the caller can do (0: it
    cannot, e.g. rank 0 after a signal save; only the batch script loops). ``replaceable``:
    the allocation has enough usable nodes without the blamed ones for a new step."""
    if cause == CAUSE_COMPLETED:
        return Decision(False, "completed")
    if cause == CAUSE_CANCELLED:
        return Decision(False, "cancelled by the user")
    restartable = (cause in RESTART_CAUSES and not blamed) or (
        cause in REPLACE_CAUSES and bool(blamed) and replaceable
    )
    can_restart = restartable and restarts_so_far < max_restarts
    if not can_restart and requeues_so_far >= max_requeues:
        used = (
            f"{restarts_so_far} restarts in the allocation reached "
            f"fault_tolerance.max_restarts={max_restarts}, "
            if restartable and max_restarts > 0
            else ""
        )
        return Decision(
            False,
            f"stopped: {used}{requeues_so_far} requeues reached "
            f"fault_tolerance.max_requeues={max_requeues}",
        )
    excluding = cause in HEALTH_CAUSES and bool(blamed)
    without = f", without {','.join(sorted(blamed))}" if blamed else ""
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
    start = resumed_from if resumed_from is not None else "none"
    count = f"(restart {restarts_so_far + 1} of {max_restarts})"
    if can_restart and cause == CAUSE_PREFLIGHT:
        return Decision(False, f"restart in the allocation after preflight{without} {count}", True)
    if can_restart:
        return Decision(
            False,
            f"restart in the allocation after {cause}: committed step {start} -> "
            f"{committed_now}{without} {count}",
            restart=True,
        )
    if not excluding:
        without = ""
    if cause == CAUSE_PREFLIGHT and excluding:
        # No step ran, so "committed step a -> b" says nothing here.
        return Decision(True, f"requeue after preflight{without}")
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
