"""How an attempt whose ranks did not complete ended, as the end hook works it out (batch
host, torch-free): the watchdog's verdict (hang, straggler, a dead node), else a crash or a node
failure (nodes Slurm reports bad or whose slurmd stopped answering), with which rank, where and
how. The blamed nodes go into the run's exclusions and, as evidence about the node, the
bad-node list. Before any of that, ``finished_in_process``: srun failed only because a rank
that an in-process restart replaced had died."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ddlaunch.job.attribution import KEEP_RANKS, attribute_safely, read_step_safely
from ddlaunch.job.blame import blame_nodes
from ddlaunch.policy import requeue as policy
from ddlaunch.policy.attribution import StepLog
from ddlaunch.policy.requeue import Ending
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import badnodes, exclusions
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId, AttemptRecord
from ddlaunch.store.inprocess import of_attempt, who_died
from ddlaunch.wording import counted


@dataclass(frozen=True)
class Blame:
    """What the endings need of the hooks' settings."""

    ranks_per_node: int
    bad_node_ttl_hours: float
    ranks_listed: int = KEEP_RANKS  # storage.ranks_listed


def crash_or_node_failure(
    run_dir: Path,
    nodes: list[str],
    attempt: AttemptId,
    client: SlurmClient,
    settings: Blame,
    step: StepLog | None = None,
) -> Ending:
    """srun may return before Slurm notices a dead node: blame nodes Slurm reports as bad or
    whose slurmd stopped answering, and keep them out of the next attempt (and, being
    evidence about the node, out of my later jobs: the bad-node list). ``step``: srun's
    reports, whose teardown's ranks make no node a suspect."""
    blamed, why = blame_nodes(run_dir, nodes, attempt, client, settings.ranks_per_node, step)
    if not blamed:
        return Ending(policy.CAUSE_CRASH)
    exclusions.leave_out(run_dir, blamed, "node failure: " + why, settings.bad_node_ttl_hours)
    return Ending(policy.CAUSE_NODE_FAILURE, blamed=tuple(blamed), record={"health": why})


def watchdog_ending(run_dir: Path, attempt: AttemptId, settings: Blame) -> Ending | None:
    """The watchdog ended this attempt (hang or straggler): its verdict names the cause and
    the nodes to exclude from this run. A straggler is evidence about its node (the
    bad-node list takes it); a hang only makes the node a suspect (``badnodes.suspect``):
    a rank stuck in the training code's own frames hangs on any node."""
    verdict = watchdog_records.read_verdict(run_dir, attempt)
    if not verdict:
        return None
    blamed = sorted(verdict.nodes or ())
    detail = verdict.detail or ""
    cause = verdict.cause or policy.CAUSE_HANG
    if blamed:
        exclusions.add_excluded(run_dir, blamed, f"{cause}: {detail}")
        source = f"run {run_dir.name}"
        hang = cause == policy.CAUSE_HANG
        ttl = settings.bad_node_ttl_hours
        badnodes.record(blamed, f"{cause}: {detail}", ttl, source, suspected=hang)
    return Ending(cause, blamed=tuple(blamed), record={"health": detail})


def failed_ending(
    run_dir: Path,
    nodes: list[str],
    attempt: AttemptId,
    index: int,
    client: SlurmClient,
    settings: Blame,
) -> Ending:
    """How an attempt whose ranks failed ended: the watchdog's verdict, else a crash or a
    node failure, with which rank, where and how (srun's reports, failure records,
    accounting)."""
    # The batch log is read once, for the blame and the attribution both.
    step = read_step_safely(run_dir, attempt, index)
    ending = watchdog_ending(run_dir, attempt, settings) or crash_or_node_failure(
        run_dir, nodes, attempt, client, settings, step
    )
    record = dict(ending.record)
    if ending.cause in (policy.CAUSE_CRASH, policy.CAUSE_NODE_FAILURE):
        keep = settings.ranks_listed
        record.update(attribute_safely(run_dir, attempt, index, client, step, keep))
    if ending.cause == policy.CAUSE_NODE_FAILURE:
        # The ranks left alive failed because a peer vanished: the node is the cause.
        record["culprit"] = f"node failure of {','.join(ending.blamed)}"
    return replace(ending, record=record)


def finished_in_process(record: AttemptRecord, exit_code: int) -> Ending | None:
    """The attempt completed although srun's status is nonzero: a rank died, a standby took
    its place in process (``fault_tolerance.restart: in_process``) and rank 0 saw every rank
    of the last generation return from the training function (``in_process_done``). srun
    reports the dead rank's status all the same. None: no such record, the usual endings
    apply. Says so in the batch log, so that the status there is not read as the run's."""
    if record.in_process_done is None:
        return None
    replaced = [r for r in of_attempt(record) if r.recovered]
    count = counted(len(replaced), "in-process restart")
    who = ", then ".join(who_died(r) for r in replaced)
    print(
        f"[ddlaunch] the ranks finished after {count}"
        + (f" ({who} replaced)" if who else "")
        + f"; srun's status {exit_code} is taken for the replaced rank's, not the run's",
        file=sys.stderr,
        flush=True,
    )
    return Ending(policy.CAUSE_COMPLETED)
