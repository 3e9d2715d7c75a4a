"""Concluding an attempt: the one place that closes an attempt's record, checks for a cancel,
applies the requeue policy, and either requeues the job (excluding blamed nodes), tells the
batch script to restart the ranks inside the allocation, or records the run's outcome.
Torch-free; called by the end hook and the preflight outcome on the batch host, and by rank 0
after a signal save (on preemption the batch shell may never reach the end hook, so the rank
requeues the job itself).

The batch host and the ranks meet only here and in ``ddlaunch.store``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ddlaunch.policy import requeue as policy
from ddlaunch.slurm.client import Requeuer, SlurmError, SlurmUnreachable
from ddlaunch.slurm.retry import Retrier, Retries
from ddlaunch.store import attempts, exclusions, outcome
from ddlaunch.store.rundir import config_path

if TYPE_CHECKING:
    from ddlaunch.slurm.partitions import PartitionFacts

# How long a requeue keeps trying while the controller does not answer (a restart, a
# failover): the job keeps its nodes meanwhile, and a run whose requeue is lost is lost.
REQUEUE_PATIENCE_S = 600.0


@dataclass(frozen=True)
class Conclusion:
    cause: str
    decision: policy.Decision
    state: str | None  # the final state recorded in outcome.json; None when retried

    @property
    def requeued(self) -> bool:
        return self.state is None and not self.decision.restart

    @property
    def restart(self) -> bool:
        """The caller (the batch script's end hook) starts a new srun step in the allocation."""
        return self.decision.restart


def _say(text: str) -> None:
    print(f"[ddlaunch] {text}", flush=True)  # into the batch log or the rank's log


def cancel_reason(
    run_dir: Path, job_id: str | None = None, client: Requeuer | None = None
) -> str | None:
    """Why the run's job was cancelled, or None. ``ddlaunch cancel`` leaves ``cancel.json``;
    a plain scancel is seen only in accounting (``client``'s sacct; measured on 22.05:
    CANCELLED there while squeue and scontrol say COMPLETING). Slurm sends the same SIGTERM
    at cancel and at preemption, and would requeue even a cancelled job, so a requeue asks
    this first."""
    if outcome.cancel_requested(run_dir):
        return "cancelled"
    if not job_id or client is None:
        return None
    try:
        row = client.accounting_rows([job_id]).get(job_id)
    except Exception:  # no accounting, or Slurm unreachable: not known to be cancelled
        return None
    return "cancelled (scancel)" if row and row.state.startswith("CANCELLED") else None


def saved_phrase(why: str, saved_step: int | None, committed: int | None) -> str:
    """``cancelled, saved step 766``: what a stopped run kept, in the words status shows."""
    if saved_step is not None:
        return f"{why}, saved step {saved_step}"
    if committed is not None:
        return f"{why}, last checkpoint step {committed}"
    return f"{why} before any checkpoint"


@dataclass(frozen=True)
class Requeued:
    """What a requeue went through: done or not (``error``: the last answer), whether the
    exclusion was set, and the retries while the controller did not answer."""

    done: bool
    excluded: bool
    retries: Retries
    error: str | None = None


def requeue_excluding(
    client: Requeuer,
    job_id: str,
    nodes: Sequence[str],
    *,
    patience_s: float | None = None,
    sleep: Callable[[float], Any] | None = None,
) -> Requeued:
    """Requeue the running job so that its next start avoids ``nodes``.

    Slurm 22.05 refuses ``ExcNodeList`` updates while a job runs ("Job is no longer pending
    execution"; measured on the dev cluster), so when setting it first fails, the order is:
    requeue, then update the now pending job while its batch step is being torn down. That
    teardown sends SIGTERM to this process, which is ignored for the second or two this
    takes (SIGKILL follows only after KillWait). While the controller does not answer, each
    call is retried (``ddlaunch.slurm.retry``) for ``patience_s`` in all."""
    retry = Retrier(REQUEUE_PATIENCE_S if patience_s is None else patience_s, sleep=sleep)
    try:
        if not nodes or retry(lambda: client.exclude_nodes(job_id, nodes), "scontrol update"):
            retry(lambda: client.requeue(job_id), "scontrol requeue")
            return Requeued(True, bool(nodes), retry.retries)
    except SlurmError as exc:
        return Requeued(False, False, retry.retries, str(exc))
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        retry(lambda: client.requeue(job_id), "scontrol requeue")
        for _ in range(20):
            with contextlib.suppress(SlurmUnreachable):  # answered a moment ago: again
                if client.exclude_nodes(job_id, nodes):
                    return Requeued(True, True, retry.retries)
            time.sleep(0.2)
        print(f"[ddlaunch] warning: could not exclude {','.join(nodes)}", flush=True)
        return Requeued(True, False, retry.retries)
    except SlurmError as exc:
        return Requeued(False, False, retry.retries, str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)


@runtime_checkable
class PartitionProbe(Protocol):
    """What the requeue's feasibility check asks of the scheduler: its partitions' nodes in
    one call (``SlurmClient``; a pod's restart has no partitions and is not checked)."""

    def partitions(self) -> list[PartitionFacts]: ...


@runtime_checkable
class ExclusionProbe(Protocol):
    """What the requeue asks of the scheduler about the job: the nodes it excludes now
    (``SlurmClient.excluded_nodes``; a pod's restart excludes none)."""

    def excluded_nodes(self, job_id: str) -> list[str] | None: ...


@dataclass(frozen=True)
class RequeueCheck:
    """A requeue that excludes nodes, checked before it is made: ``nodes``, the job's
    excluded nodes after it (Slurm's ``ExcNodeList`` update replaces the list, so the nodes
    the job excludes already, the config's ``nodes.exclude`` and the bad-node list's at its
    submission among them, go in again beside the run's exclusions); ``shortage``, why the
    job could never start without them (None: it can, or the facts cannot tell)."""

    nodes: list[str]
    shortage: str | None = None


def job_excluded(client: object, job: str) -> list[str]:
    """The nodes ``job`` excludes now, as Slurm says (one ``scontrol show job``): what it
    was submitted with (``--exclude``: the config's and my bad-node list's then) and what
    earlier requeues added; none where it cannot be asked."""
    if not job or not isinstance(client, ExclusionProbe):
        return []
    try:
        return client.excluded_nodes(job) or []
    except Exception:  # Slurm unreachable: the exclusions the run knows itself still go in
        return []


def check_requeue(
    run_dir: Path, client: object, leaving: Sequence[str], job: str = ""
) -> RequeueCheck:
    """Check a requeue of ``job`` that newly leaves ``leaving`` out
    (``feasibility.requeue_shortage``, the rule submit and resume apply), with one ``sinfo``
    call however many nodes, and one ``scontrol show job`` for the nodes the job excludes
    now. A config that cannot be read or a probe that fails leaves the requeue as it was:
    the check only ever stops a job the facts say could never start."""
    # Loaded here, not with the module: every ending imports this module, and only a requeue
    # that leaves nodes out reads the config (~37 ms of imports).
    from ddlaunch.config.validate import load_config
    from ddlaunch.planning.feasibility import requeue_shortage

    run_excluded = exclusions.excluded(run_dir)
    kept = job_excluded(client, job)
    try:
        cfg = load_config(config_path(run_dir))
    except Exception:
        return RequeueCheck(sorted({*kept, *run_excluded}))
    why = {n: "excluded from this job already (its ExcNodeList)" for n in kept}
    why.update({n: "nodes.exclude in the config" for n in cfg.nodes.exclude})
    why.update({n: "excluded by this run after a failure" for n in run_excluded})
    nodes = sorted(why)
    if not isinstance(client, PartitionProbe):
        return RequeueCheck(nodes)
    try:
        partitions = client.partitions()
    except Exception:  # Slurm unreachable or sinfo failed: requeue as before
        return RequeueCheck(nodes)
    # The partition Slurm runs the job in, whatever the config asked (requeue_shortage).
    where = os.environ.get("SLURM_JOB_PARTITION")
    return RequeueCheck(nodes, requeue_shortage(cfg, partitions, why, leaving, where))


def requeued_meanwhile(client: Requeuer | None, job: str, restart: int | None) -> bool:
    """Whether Slurm restarted ``job`` after the attempt with ``restart`` began (someone
    else ran ``scontrol requeue``): then requeueing again would cost a second restart."""
    if restart is None or client is None:
        return False
    try:
        now = client.restarts(job)
    except Exception:  # Slurm unreachable: requeue as usual
        return False
    return now is not None and now > restart


def _requeue(run_dir: Path, client: Requeuer, job: str, nodes: Sequence[str]) -> str | None:
    """Requeue ``job``; the attempt records what it took when Slurm did not answer at once.
    Returns None, or why the job could not be requeued.

    A requeue that gets through tears the batch step down at once, and its SIGTERM reaches
    this hook: ignored until the record is written (SIGKILL comes only after KillWait). Seen
    on the dev cluster under load: the hook died between the requeue and the record, and the
    attempt kept no trace of the tries it had taken."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        done = requeue_excluding(client, job, nodes)
        if done.retries.errors or not done.done:
            record = done.retries.record()
            attempts.update_last(run_dir, requeue={**record, "done": done.done})
    finally:
        signal.signal(signal.SIGTERM, previous)
    if done.done:
        return None
    tries = f" after {done.retries.tries} tries in {done.retries.elapsed_s:.0f} s"
    return f"requeue failed{tries if done.retries.tries > 1 else ''}: {done.error}"


def conclude(
    run_dir: Path,
    ending: policy.Ending,
    budget: policy.RetryBudget,
    client: Requeuer | None,
    *,
    job: str = "",
    restart: int | None = None,
    say: Callable[[str], None] = _say,
    details: Mapping[str, object] | None = None,
) -> Conclusion:
    """Close the newest attempt with ``ending`` and act on the requeue policy within
    ``budget``: record a restart (the caller starts it), requeue ``job`` through ``client``,
    or record the run's outcome.

    ``job``: what to requeue (``AttemptId.task``; empty outside Slurm: nothing to requeue,
    and the budget's restarts do not apply). The requeue sets the job's excluded nodes anew
    when the ending blamed any. ``restart``: this attempt's restart count, given where the
    trainer may have run ``scontrol requeue`` itself (Lightning's auto-requeue): a job Slurm
    restarted since is not requeued a second time. ``say``: where the decision is told (the
    log; a login-node caller passes its own). ``details``: more fields for ``outcome.json``
    (a local run's duration)."""
    records = attempts.load(run_dir)
    history = policy.History(
        resumed_from=records[-1].resumed_from if records else None,
        requeues=attempts.requeues(records),
        restarts=attempts.restarts(records),
    )
    if not job:
        budget = replace(budget, max_restarts=0)
    cause = ending.cause
    decision = policy.decide(ending, budget, history)
    if cause == policy.CAUSE_SIGNAL or decision.retry:
        # A cancel and a preemption look alike from inside the job: ask before requeueing.
        why = cancel_reason(run_dir, job, client)
        if why:
            cause = policy.CAUSE_CANCELLED
            said = saved_phrase(why, ending.saved_step, ending.committed_step)
            decision = policy.Decision(False, said)
    already = bool(decision.requeue and job and requeued_meanwhile(client, job, restart))
    if already:
        decision = policy.Decision(True, f"{decision.reason} (the trainer requeued the job)")
    nodes: list[str] = []
    if decision.requeue and job and client is not None and not already and ending.blamed:
        # A requeue without the blamed nodes that leaves the partition too few would pend
        # for good (BadConstraints): the run stops here with the numbers instead.
        check = check_requeue(run_dir, client, ending.blamed, job)
        nodes = check.nodes
        if check.shortage is not None:
            decision = policy.Decision(False, check.shortage)
    closed = attempts.end_last(
        run_dir,
        cause=cause,
        committed_step=ending.committed_step,
        decision=decision.reason,
        blamed=list(ending.blamed),
        **ending.record,
    )
    if decision.restart:
        say(decision.reason)
        return Conclusion(cause, decision, None)
    if decision.requeue and job and client is not None:
        say(decision.reason)
        lost = None
        if not already:
            lost = _requeue(run_dir, client, job, nodes)
        if lost is None:
            return Conclusion(cause, decision, None)
        decision = policy.Decision(False, f"{lost}; ddlaunch resume {run_dir.name} continues")
    recorded = None if closed else outcome.read_outcome(run_dir)
    if recorded is not None and recorded.state:
        # Someone concluded this attempt and the run before (the guard's stop, the end
        # hook): their outcome is the true one, not this later conclusion's.
        say(f"{recorded.state}: {recorded.reason} (recorded before)")
        return Conclusion(cause, decision, recorded.state)
    state = policy.final_state(cause)
    outcome.write_outcome(run_dir, state, decision.reason, **(details or {}))
    say(f"{state}: {decision.reason}")
    return Conclusion(cause, decision, state)
