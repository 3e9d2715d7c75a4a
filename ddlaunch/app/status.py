"""Run status: the run directory joined with one batched Slurm query (pure joining logic).

``poll`` is the one place that talks to Slurm for ``status``: ONE squeue call per poll for
every job ddlaunch knows, whatever their number (array tasks of a sweep collapse to their
array id; ``-t all`` includes jobs that ended but are still kept by the controller), and at
most one batched ``sacct`` for jobs the controller forgot whose run directory does not
already know how they ended. The runner is injected, so tests count the calls.
Everything else (``run_status``, ``health_line``, ``sweep_row``) is pure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, NotRequired, TypedDict

from ddlaunch.app.runs import (
    RunInfo,
)
from ddlaunch.app.status_blame import Blame, blame, verdict_words
from ddlaunch.app.status_step import current_step
from ddlaunch.policy.requeue import (
    CAUSE_CRASH,
    CAUSE_NODE_FAILURE,
    CAUSE_PREFLIGHT,
    HEALTH_CAUSES,
)
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store import group_state
from ddlaunch.store.attempts import AttemptRecord
from ddlaunch.store.balance import describe as describe_shares
from ddlaunch.store.components import describe as describe_service
from ddlaunch.store.failures import Failure, is_collateral
from ddlaunch.store.group_restarts import GroupRestart
from ddlaunch.store.group_restarts import describe as describe_group_restart
from ddlaunch.store.group_restarts import last_time as last_group_restart
from ddlaunch.store.group_state import GroupsState
from ddlaunch.store.inprocess import InProcessRestart, describe, of_attempt
from ddlaunch.store.standbys import StandbyBook, hosts_by_count

if TYPE_CHECKING:  # the module itself is imported lazily (most polls show no staging)
    from ddlaunch.policy.staging import NodeStaging

# Slurm's many job states folded into the few a user acts on.
STATE_MAP = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "SIGNALING": "RUNNING",
    "SUSPENDED": "SUSPENDED",
    "STOPPED": "SUSPENDED",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED",
    "OUT_OF_MEMORY": "FAILED",
    "BOOT_FAIL": "FAILED",
    "DEADLINE": "FAILED",
    "NODE_FAIL": "NODE_FAIL",
    "PREEMPTED": "PREEMPTED",
    "TIMEOUT": "TIMEOUT",
    "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED",
}
ACTIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED")
# Final states a run keeps unless it is submitted again (which writes into its directory).
# Not PREEMPTED or NODE_FAIL straight from Slurm: Slurm itself may requeue such a job.
SETTLED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "STOPPED", "SUBMIT_FAILED", "BOOT_FAIL"}
)
# Failure records of these runs are from earlier attempts or the teardown: not the story.
QUIET_FAILURES = ("COMPLETED", "CANCELLED")


def fold_state(slurm_state: str) -> str:
    # sacct prints "CANCELLED by 0"; JSON of newer releases gives lists joined elsewhere.
    head = slurm_state.split()[0].upper() if slurm_state.strip() else ""
    return STATE_MAP.get(head, head or "UNKNOWN")


class AttemptSummary(TypedDict):
    """One attempt as ``status`` shows it (``attempt_history``; ``status --json`` writes it
    as it is): where it ran, how it ended and why."""

    attempt: int | None
    job_id: str | None
    nodes: str
    start: float | None
    end: float | None
    cause: str
    resumed_from: int | None
    committed_step: int | None
    blamed: list[str]
    detail: NotRequired[str]  # the failed node checks, or the signal
    preflight: NotRequired[list[dict[str, object]]]  # the verdicts per node
    in_allocation: NotRequired[bool]  # a new srun step of the same job start
    shrunk: NotRequired[str]  # fewer nodes than nodes.count (nodes.min)
    culprit: NotRequired[str]  # the rank that ended it, in words
    group_restarts: NotRequired[list[dict[str, object]]]  # replica groups restarted alone
    # fault_tolerance.restart: in_process: each in-process restart, as the ranks wrote it
    # (``in_process_line`` says one in words)
    in_process_restarts: NotRequired[list[dict[str, object]]]
    # ... and its standbys while it runs (``standbys.json``; ``standbys_line`` says them)
    standbys: NotRequired[dict[str, object]]


@dataclass
class RunStatus:
    run_id: str
    path: str
    job_id: str | None
    state: str
    nodes: str
    reason: str
    step: int | None
    checkpoint_step: int | None
    attempts: int | None
    failure: str | None  # the run's failure: said once the run ended
    detail: str | None
    # While the run has not ended: its open attempt's failure with the verdict pending, or
    # the verdict once recorded (``status_blame``)
    failing: str | None = None
    label: str | None = None
    history: list[AttemptSummary] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    health: str = ""
    heartbeat: dict[str, object] | None = None  # health/watchdog.json, while it runs
    snapshot: str | None = None  # the code snapshot the run's ranks use
    staging: dict[str, dict[str, object]] | None = None  # the last attempt's, per node
    submitted: float | None = None
    members: dict[str, int] | None = None  # a sweep's row: members per state
    problems: list[str] = field(default_factory=list)  # records that could not be read
    services: list[str] = field(default_factory=list)  # components: each service in words
    batch_shares: str | None = None  # balance.json in words (balance: by_throughput)

    def as_dict(self) -> dict[str, object]:
        # Shallow on purpose: the fields are plain data already, and dataclasses.asdict's deep
        # copy costs more than the rest of `status --json` for a 1000-member sweep.
        return {f.name: getattr(self, f.name) for f in fields(self)}


# The taken standbys ``standbys_line`` says, the latest (the others are counted).
SHOWN_TAKEN = 4
CLOCK_SLACK_S = 5.0  # the ranks' clocks are other nodes' clocks


def look_back(text: str) -> float:
    """``--since`` (``ddlaunch.runs(since=...)``): how far back finished runs are shown, in
    seconds. Raises ValueError with the words to show ("never" is a bad-node list's
    duration, not a look back)."""
    from ddlaunch.store.badnodes import parse_ttl  # lazy: only when asked

    try:
        seconds = parse_ttl(text)
    except ValueError:
        seconds = None
    if seconds is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 12h or 7d)")
    return seconds


def failures_of(record: AttemptRecord, failures: Sequence[Failure]) -> list[Failure]:
    """The failure records written in the attempt ``record`` (its restart count, and no
    earlier than it started: a resumed run's new job counts its restarts from 0 again);
    a rank's record is replaced by its next failure, so only the latest ones remain."""
    restart = record.restart_count or 0
    relaunch = record.relaunch or 0  # a restart in the allocation
    start = float(record.start or 0.0)
    end = record.end
    return [
        f
        for f in failures
        if int(f.attempt or 0) == restart
        and f.relaunch == relaunch
        and f.time >= start - CLOCK_SLACK_S
        and (end is None or f.time <= float(end) + CLOCK_SLACK_S)
    ]


# Endings whose failure records say which rank failed (a hang or a failed preflight has its
# own words, the health detail; a completed or saved attempt had no failure).
_RANK_FAILURES = (CAUSE_CRASH, None)


def attempt_failure(record: AttemptRecord, failures: Sequence[Failure]) -> str | None:
    """Which rank ended the attempt, where and how, in words: the end hook's attribution
    (``culprit``: a rank killed by a signal leaves no failure record), else the first of
    its failure records (cause first), else None."""
    if record.culprit:
        return record.culprit
    if record.cause not in _RANK_FAILURES:
        return None
    mine = failures_of(record, failures)
    if not mine:
        return None
    if is_collateral(mine[0]):
        # Every record is a peer's error: the rank that caused them left none.
        return f"{mine[0].one_line()} (a peer's error; the failing rank left no record)"
    return mine[0].one_line()


def attempt_history(info: RunInfo, state: str = "RUNNING") -> list[AttemptSummary]:
    """Each attempt in a compact, stable form: where it ran, how it ended and why. An
    attempt nobody closed (the job was killed before its end hook) of a run that is over
    ends as the run did."""
    out = []
    book = info.standbys if state in ACTIVE_STATES else None  # a run that ended has none
    for rec in info.attempts:
        cause = rec.cause
        if not cause:
            cause = (
                "?" if not rec.is_open else "running" if state in ACTIVE_STATES else state.lower()
            )
        item: AttemptSummary = {
            "attempt": rec.attempt,
            "job_id": rec.job_id,
            "nodes": rec.nodes or "",
            "start": rec.start,
            "end": rec.end,
            "cause": cause,
            "resumed_from": rec.resumed_from,
            "committed_step": rec.committed_step,
            "blamed": list(rec.blamed or []),
        }
        why = rec.health or rec.signal
        if why:
            item["detail"] = why
        if rec.preflight:
            item["preflight"] = [dict(p) for p in rec.preflight]
        if rec.in_allocation:
            item["in_allocation"] = True  # a new srun step of the same job start: no requeue
        if rec.shrunk:
            item["shrunk"] = rec.shrunk  # fewer nodes than nodes.count (nodes.min)
        culprit = attempt_failure(rec, info.failures) if not rec.is_open else None
        if culprit:
            item["culprit"] = culprit
        if rec.group_restarts:
            item["group_restarts"] = [g.to_json() for g in rec.group_restarts]
        if rec.in_process_restarts:
            item["in_process_restarts"] = [r.to_json() for r in rec.in_process_restarts]
        if book is not None and rec.is_open and book.attempt == rec.key:
            item["standbys"] = book.as_dict()  # waiting now: an attempt that ended has none
        out.append(item)
    return out


def health_line(info: RunInfo, now: float, state: str = "RUNNING") -> str:
    """Node health in one line: the latest preflight, exclusions, the heartbeat (while the
    run runs: a finished run's last heartbeat is no news)."""
    parts = []
    if info.preflight:
        # Lazy: the verdicts module (statistics, enum) costs more than the rest of a poll.
        from ddlaunch.policy.preflight import summary_line

        parts.append("preflight " + summary_line(info.preflight.verdicts or ()))
    # "preflight failed on node2": beside the latest preflight's "preflight 2 ok" (the spare
    # that replaced it passed), "preflight on node2" read as a second, passing check.
    blamed = [
        f"{'preflight failed' if a.cause == CAUSE_PREFLIGHT else a.cause} on {','.join(a.blamed)}"
        for a in info.attempts
        if a.blamed and a.cause in HEALTH_CAUSES
    ]
    if blamed:
        parts.append("; ".join(blamed))
    if info.excluded:
        parts.append("excluded " + ",".join(info.excluded))
    if info.staging:
        # Lazy, as the preflight verdicts: most polls show no staging.
        from ddlaunch.policy.staging import summary as staging_summary

        parts.append(staging_summary(info.staging))
    latest = info.attempts[-1] if info.attempts else None
    if info.groups and latest is not None and latest.is_open and state == "RUNNING":
        parts.append(groups_summary(info.groups))
    hb = info.watchdog
    if hb and latest is not None and latest.is_open and state == "RUNNING":
        began = latest.start
        beat_time = hb.time if hb.time is not None else now
        if began is not None and beat_time < began:
            # The summary is the previous attempt's (the new one's watchdog has not polled
            # yet): its beats are the dead ranks', and the step it gave is behind us now.
            parts.append(starting(latest))
        else:
            age = now - beat_time + (hb.oldest_beat_age or 0.0)
            parts.append(f"heartbeat {age:.0f} s ago")
    return "; ".join(parts)


def groups_summary(state: GroupsState) -> str:
    """``replica groups: 1 of 2 training (group 1 healing on node3, restart 1)``."""
    training = sum(1 for g in state.groups if g.state == group_state.TRAINING)
    others = [
        f"group {g.group} {g.state} on {','.join(g.nodes)}"
        + (f", restart {g.restarts}" if g.restarts else "")
        for g in state.groups
        if g.state != group_state.TRAINING
    ]
    text = f"replica groups: {training} of {len(state.groups)} training"
    return text + (f" ({'; '.join(others)})" if others else "")


def starting(attempt: AttemptRecord) -> str:
    """``attempt 1 starting from step 150``: a new attempt before its first heartbeat."""
    origin = attempt.resumed_from
    where = f"from step {origin}" if origin is not None else "from scratch"
    number = attempt.attempt if attempt.attempt is not None else "?"
    return f"attempt {number} starting {where}"


def _state_from_run_dir(info: RunInfo) -> str:
    """How a run ended, when Slurm has nothing to say: its own records."""
    if info.outcome is not None:
        return info.outcome.state or "UNKNOWN"
    if info.cancel_requested:
        return "CANCELLED"  # asked for, and the job is gone: it did not run to its end
    if info.result is not None:
        return "COMPLETED"
    if info.failures:
        return "FAILED"
    if info.submit_failed:
        return "SUBMIT_FAILED"
    return "UNKNOWN"


def run_status(
    info: RunInfo,
    queued: QueueRow | None,
    shown: dict[str, str] | None = None,
    now: float | None = None,
    final: str | None = None,
) -> RunStatus:
    """Combine what Slurm says (queue row, or scontrol fields for a job that left the queue)
    with what the run directory says. ``final``: the run's final state, cached by an
    earlier poll (no Slurm state is asked for it)."""
    now = time.time() if now is None else now
    nodes, reason = "", ""
    if final is not None:
        state = final
    elif queued is not None:
        state, nodes, reason = fold_state(queued.state), queued.nodes, queued.reason
    elif shown is not None:
        state = fold_state(shown.get("JobState", ""))
        nodes, reason = shown.get("NodeList", ""), shown.get("Reason", "")
    elif info.intent is not None and info.intent.target == "kubernetes":
        state = pod_state(info)
    else:
        state = _state_from_run_dir(info)
    # How the job itself concluded is more precise than Slurm's view of the job that ended.
    if info.outcome is not None and state not in ACTIVE_STATES:
        state = info.outcome.state or state
    said = run_blame(info, ended=state not in ACTIVE_STATES)
    failure, failing = said.headline, said.meanwhile
    if state in QUIET_FAILURES:
        failure = None
    if state == "SUBMIT_FAILED":
        failure = (info.intent.error if info.intent is not None else None) or ""
    detail = info.outcome.reason if info.outcome is not None and info.outcome.reason else None
    if detail is not None and detail.lower() == state.lower():
        detail = None  # "COMPLETED: completed" says nothing more
    if not nodes and info.attempts:
        nodes = info.attempts[-1].nodes or ""
    return RunStatus(
        run_id=info.run_id,
        path=str(info.path),
        # A run on Kubernetes is known by its JobSet's or PyTorchJob's name.
        job_id=info.job_id or (info.intent.object_name if info.intent is not None else None),
        state=state,
        nodes=nodes if nodes not in ("(null)", "None") else "",
        # Why a job waits; the reason Slurm keeps for a job that ended is stale.
        reason=reason if state == "PENDING" and reason not in ("None", "(null)") else "",
        step=current_step(info),
        checkpoint_step=info.latest_step,
        attempts=len(info.attempts),
        failure=failure,
        detail=detail,
        failing=failing,
        label=info.label,
        history=attempt_history(info, state),
        excluded=list(info.excluded),
        health=health_line(info, now, state),
        heartbeat=info.watchdog.to_json() if info.watchdog and state == "RUNNING" else None,
        submitted=info.submitted,
        snapshot=info.snapshot,
        staging=staging_nodes(info.staging),
        problems=list(info.problems),
        # A service's record is checked against the job's state: a supervisor killed with
        # the job leaves it saying running.
        services=[describe_service(s, state) for s in info.services],
        batch_shares=describe_shares(info.balance),
    )


def pod_state(info: RunInfo) -> str:
    """A run of --target kubernetes, from its run directory alone (no API server call): the
    leader pod's records say whether an attempt runs, restarts or how the run ended."""
    if info.outcome is not None:
        return info.outcome.state or "UNKNOWN"
    if info.attempts:  # a pod started (applied here, or by hand from elsewhere)
        return "RUNNING" if info.attempts[-1].is_open else "RESTARTING"
    intent_state = info.intent.state if info.intent is not None else None
    if intent_state == "failed":
        return "SUBMIT_FAILED"
    if intent_state == "written":
        return "NOT_APPLIED"  # kubectl could not run where it was submitted
    return "PENDING"  # applied; no pod has started (admission, scheduling, image pull)


class NoScheduler:
    """The Slurm client's place for ``status --target kubernetes``: no scheduler to ask."""

    def status_rows(self, job_ids: Sequence[str], form: str = "text") -> dict[str, QueueRow]:
        return {}

    def accounting_rows(self, job_ids: Sequence[str]) -> dict[str, QueueRow]:
        return {}


def run_failure(info: RunInfo) -> str | None:
    """The latest attempt's failure as the headline of a run that ended would say it (the
    verdict over a rank's record; an earlier attempt's failure is history, shown with its
    attempt); for a run without attempt records, its first failure record."""
    return run_blame(info, ended=True).headline


def run_blame(info: RunInfo, *, ended: bool) -> Blame:
    """The run's failure headline (``ended``: the run is in a final state) and, while it has
    not ended, what its open attempt's failure is known to be (``status_blame.blame``: a
    rank's record waits for the verdict)."""
    if not info.attempts:
        first = info.failures[0].one_line() if info.failures else None
        return Blame(headline=first if ended else None)
    latest = info.attempts[-1]
    if not latest.is_open:
        return blame(
            ended=ended,
            attempt_open=False,
            failure=None,
            verdict=None,
            concluded=attempt_failure(latest, info.failures),
        )
    # A rank that failed after its replica group was restarted, or after a standby took its
    # place in process, is not the news: the restart's line says what failed.
    handled = max(_last_group_restart(latest), _last_in_process_restart(latest))
    mine = [f for f in failures_of(latest, info.failures) if f.time > handled + CLOCK_SLACK_S]
    return blame(
        ended=ended,
        attempt_open=True,
        failure=mine[0] if mine else None,
        verdict=open_verdict(info),
    )


def open_verdict(info: RunInfo) -> str | None:
    """The blame recorded for the latest attempt while it is open, in words: the watchdog's
    verdict (it ends the step), else the node it found dead while Slurm is to requeue, else
    the guard's requeue; None while none is recorded."""
    latest = info.attempts[-1] if info.attempts else None
    if latest is None or not latest.is_open:
        return None
    v = info.verdict
    if v is not None and v.cause:
        return verdict_words(v.cause, v.nodes or (), v.detail)
    if latest.dead_nodes:
        return verdict_words(CAUSE_NODE_FAILURE, latest.dead_nodes, latest.dead_why)
    return latest.guard or None


def _last_group_restart(record: AttemptRecord) -> float:
    """When the attempt's replica-group supervisor last handled a group's failure (a restart
    or a group given up); minus infinity when none did."""
    return last_group_restart(record.group_restarts or ())


def _last_in_process_restart(record: AttemptRecord) -> float:
    """When the attempt's ranks last recovered from a failure in process; minus infinity
    when they never did (a fall-back is no recovery: the attempt is ending)."""
    times = [r.time for r in of_attempt(record) if r.recovered and r.time is not None]
    return max(times, default=float("-inf"))


def group_restart_line(entry: Mapping[str, object]) -> str:
    """One ``group_restarts`` entry of an attempt's summary in words (``status RUN``)."""
    return describe_group_restart(GroupRestart.from_json(entry))


def in_process_line(entry: Mapping[str, object]) -> str:
    """One ``in_process_restarts`` entry of an attempt's summary in words (``status RUN``)."""
    return describe(InProcessRestart.from_mapping(entry))


def standbys_line(data: Mapping[str, object]) -> str:
    """An attempt's standbys (``standbys.json``) in one line: ``standbys: 3 waiting, 1 on
    node1, 2 on node3; node2 lost; taken: rank 2 on node3 (in-process restart 1, pid 41)``.
    The nodes are grouped by count and written as Slurm writes a node list, and the latest
    ``SHOWN_TAKEN`` taken standbys are said (the others counted), so that the line stays
    short at 2,000 nodes."""
    from ddlaunch.slurm.hostlist import compress_hostlist

    book = StandbyBook.from_mapping(data)
    if book is None:
        return "standbys: (unreadable record)"
    groups, empty = [], []
    for waiting, spare, hosts in hosts_by_count(book):
        where = ("spare " if spare else "") + compress_hostlist(hosts)
        if waiting == 0:
            empty.append(where)
        else:
            groups.append(f"{waiting} on {'each of ' if len(hosts) > 1 else ''}{where}")
    parts = [f"standbys: {book.waiting} waiting" + (", " + ", ".join(groups) if groups else "")]
    if empty:
        parts.append(f"none left on {', '.join(empty)}")
    lost = [n.host for n in book.nodes if n.lost]
    if lost:
        parts.append(f"{compress_hostlist(lost)} lost")
    shown = book.taken[-SHOWN_TAKEN:]
    if shown:
        taken = ", ".join(
            f"rank {t.rank} on {t.host} (in-process restart {t.generation}"
            + (f", pid {t.rank_pid})" if t.rank_pid is not None else ")")
            for t in shown
        )
        earlier = book.taken_count - len(shown)
        parts.append(f"taken: {taken}" + (f" and {earlier} earlier" if earlier > 0 else ""))
    return "; ".join(parts)


def staging_nodes(
    records: Mapping[str, NodeStaging] | None,
) -> dict[str, dict[str, object]] | None:
    """Per node: state, bytes copied of the data's size, seconds (``status --json``)."""
    if not records:
        return None
    out: dict[str, dict[str, object]] = {}
    for host, rec in sorted(records.items()):
        items = rec.items or ()
        start, end = rec.start, rec.end
        out[host] = {
            "state": rec.state,
            "copied_bytes": sum(int(i.get("bytes", 0)) for i in items),
            "total_bytes": sum(int(i.get("total_bytes", 0)) for i in items),
            "seconds": round(end - start, 3) if start and end else None,
            **({"progress": dict(rec.progress)} if rec.progress is not None else {}),
        }
    return out


def settled(info: RunInfo, row: RunStatus) -> bool:
    """Whether ``row`` is the run's final state, to be cached until its directory changes."""
    if row.state in ACTIVE_STATES or row.state == "UNKNOWN" or info.problems:
        return False  # a state read from damaged records is no truth to keep
    return info.outcome is not None or row.state in SETTLED_STATES


def needs_accounting(info: RunInfo) -> bool:
    """A job the controller forgot: only sacct can say how it ended, unless the job's own
    conclusion did (``outcome.json``). A result file does not: the job may have been
    cancelled between the training's last step and its end."""
    return bool(info.job_id) and info.outcome is None


def min_poll_interval() -> float:
    """The floor of ``status --watch``: 30 s unless $DDLAUNCH_MIN_POLL_S says otherwise (each
    poll is a query to the controller; thousands of users polling fast overload it)."""
    try:
        return float(os.environ.get("DDLAUNCH_MIN_POLL_S", "30"))
    except ValueError:
        return 30.0
