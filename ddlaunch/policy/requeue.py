"""Whether an attempt that ended gets another one: the one requeue policy (pure).

Blind retries mostly fail, so a crash is retried only if the committed step advanced during
the attempt (it made progress) and the cap is not reached: the progress guard stops code that
fails again and again without committing. A signal-triggered stop of Session code has just
saved, so it passes the progress test by construction; it still counts. A stop ddlaunch asked
of another trainer is retried whatever its exit code, if the step advanced. A node that died,
failed preflight, hung or straggled is left out of the retry, so that retry is not blind
either: the node was at fault, not the code, and a retry without it says nothing about the
code. It is allowed without the progress test (preflight runs before any step, and a node may
die before the first checkpoint, from scratch then), within the caps, which bound a run whose
nodes keep failing. A node failure or a health finding with no node to blame is treated like a
crash.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddlaunch.wording import counted

# How an attempt ended.
CAUSE_COMPLETED = "completed"
CAUSE_SIGNAL = "signal"  # pre-timeout / preemption signal: saved, then requeued
CAUSE_CRASH = "crash"  # nonzero exit (exception, collective timeout, killed rank)
CAUSE_REQUEUED_BY_SLURM = "requeued by Slurm"  # node failure (or preemption) before any hook
CAUSE_NODE_FAILURE = "node failure"  # srun failed and Slurm reports a node of it as bad
# The job ended before its end hook ran (its batch script killed, a node lost at once) and the
# run went on in another job (``resume``): Slurm did not requeue it; its accounting says how.
CAUSE_JOB_ENDED = "job ended"
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


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as whoever concludes it worked it out.

    ``cause``: one of the ``CAUSE_*`` above. ``committed_step``: the newest complete
    checkpoint now. ``blamed``: nodes a health check (preflight, hang, straggler) or a node
    failure singled out; the caller added them to the run's exclusions and the retry leaves
    them out. ``record``: more fields for the attempt record (exit code, the culprit rank and
    its signal, health detail). ``saved_step``: the step a signal save just committed, said
    in a cancelled run's outcome. ``final``: a reason that rules out any retry (every node
    failed preflight, a checkpoint save failed on every rank)."""

    cause: str
    committed_step: int | None = None
    blamed: tuple[str, ...] = ()
    record: Mapping[str, object] = field(default_factory=dict)
    saved_step: int | None = None
    final: str | None = None

    @property
    def culprit(self) -> str | None:
        """The first cause in words, as attribution named it (``rank 1 on node1 killed by
        SIGKILL``, ``node failure of node2``); None where none was named."""
        named = self.record.get("culprit")
        return None if named is None else str(named)


@dataclass(frozen=True)
class RetryBudget:
    """What the concluding caller may spend on a retry. ``max_requeues``: the run's cap.
    ``max_restarts``: restarts inside the allocation the caller can start (only the batch
    script's end hook, whose script loops; 0 elsewhere). ``replaceable``: the allocation has
    usable nodes enough without the blamed ones (a hot spare, or ``nodes.min`` allows fewer),
    so a restart may leave them out."""

    max_requeues: int = 0
    max_restarts: int = 0
    replaceable: bool = False


# A caller that can only record the outcome (a local run, a cancel): no retry of any kind.
NO_RETRY = RetryBudget()


@dataclass(frozen=True)
class History:
    """What the run's earlier attempts used: the step this attempt resumed from, and the
    requeues and restarts so far."""

    resumed_from: int | None = None
    requeues: int = 0
    restarts: int = 0


def restartable(cause: str, blamed: Sequence[str], replaceable: bool) -> bool:
    """The restart rule: a new step in the same allocation can retry this ending. Without a
    blamed node, for endings where the ranks failed and the nodes did not; with blamed nodes,
    for endings that singled out nodes, where the allocation can do without them."""
    if blamed:
        return cause in REPLACE_CAUSES and replaceable
    return cause in RESTART_CAUSES


def decide(ending: Ending, budget: RetryBudget, history: History = History()) -> Decision:
    """Retry after ``ending``, and how, within ``budget`` and what ``history`` used."""
    cause, blamed, committed_now = ending.cause, ending.blamed, ending.committed_step
    if ending.final is not None:
        return Decision(False, ending.final)
    if cause == CAUSE_COMPLETED:
        return Decision(False, "completed")
    if cause == CAUSE_CANCELLED:
        return Decision(False, "cancelled by the user")
    max_restarts, restarts_so_far = budget.max_restarts, history.restarts
    requeues_so_far, max_requeues = history.requeues, budget.max_requeues
    can_restart = restartable(cause, blamed, budget.replaceable) and restarts_so_far < max_restarts
    if not can_restart and requeues_so_far >= max_requeues:
        used = (
            f"{counted(restarts_so_far, 'restart')} in the allocation reached "
            f"fault_tolerance.max_restarts={max_restarts}, "
            if restartable(cause, blamed, budget.replaceable) and max_restarts > 0
            else ""
        )
        return Decision(
            False,
            f"stopped: {used}{counted(requeues_so_far, 'requeue')} reached "
            f"fault_tolerance.max_requeues={max_requeues}",
        )
    # The retry leaves the blamed nodes out (the caller excluded them: a restart places the
    # ranks without them, a requeue sets them as the job's excluded nodes).
    excluding = cause in REPLACE_CAUSES and bool(blamed)
    without = f", without {','.join(sorted(blamed))}" if blamed else ""
    guarded = cause in (CAUSE_CRASH, CAUSE_TRAINER_STOP) or (
        cause in REPLACE_CAUSES and not excluding
    )
    resumed_from = history.resumed_from
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
    start = _step(resumed_from)
    now = _step(committed_now)
    count = f"(restart {restarts_so_far + 1} of {max_restarts})"
    if can_restart and cause == CAUSE_PREFLIGHT:
        return Decision(False, f"restart in the allocation after preflight{without} {count}", True)
    if can_restart:
        return Decision(
            False,
            f"restart in the allocation after {cause}: committed step {start} -> "
            f"{now}{without} {count}",
            restart=True,
        )
    if not excluding:
        without = ""
    if cause == CAUSE_PREFLIGHT and excluding:
        # No step ran, so "committed step a -> b" says nothing here.
        return Decision(True, f"requeue after preflight{without}")
    return Decision(True, f"requeue after {cause}: committed step {start} -> {now}{without}")


def _step(step: int | None) -> str:
    """A committed step in a decision's words: ``none`` before the first checkpoint."""
    return "none" if step is None else str(step)


def final_state(cause: str) -> str:
    """The outcome's state for an attempt that was not requeued."""
    if cause == CAUSE_COMPLETED:
        return COMPLETED
    if cause == CAUSE_CANCELLED:
        return CANCELLED
    if cause in (CAUSE_SIGNAL, CAUSE_TRAINER_STOP):
        return STOPPED  # stopped for the time limit (saved), but no requeue is left
    return FAILED
