"""``attempts.json``: one record per start of the ranks (the first submission, each requeue,
each restart inside the allocation: ``in_allocation``, ``relaunch``): when it started, on
which nodes, from which committed step it resumed, and how and why it ended. Opened by the
start hook, closed by whoever concludes the attempt (``ddlaunch.conclude``).

``AttemptId`` names an attempt as every record of it does: the Slurm job id and its restart
count, read from the job's environment in one place.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddlaunch import fsutil
from ddlaunch.policy.requeue import CAUSE_REQUEUED_BY_SLURM
from ddlaunch.store import records
from ddlaunch.store.group_restarts import GROUP_RESTARTS, GroupRestart
from ddlaunch.store.inprocess import RESTARTS, InProcessRestart
from ddlaunch.store.layout import KUBERNETES_JOB_VAR, KUBERNETES_RESTART_VAR
from ddlaunch.store.records import BOOL, INT, NUMBER, OBJECTS, STRINGS, TEXT

ATTEMPTS_FILE = "attempts.json"
# The fields of an attempt record readers rely on, with their kinds (``store.records.clean``);
# ``AttemptRecord`` has one attribute for each.
FIELDS = {
    "attempt": INT,
    "job_id": TEXT,
    "restart_count": INT,
    "nodes": TEXT,
    "batch_host": TEXT,
    "start": NUMBER,
    "end": NUMBER,
    "cause": TEXT,
    "decision": TEXT,
    "resumed_from": INT,
    "committed_step": INT,
    "blamed": STRINGS,
    # The batch log's size when the start hook opened the attempt: where this attempt's part
    # of it begins (a requeued job appends to the same file).
    "log_offset": INT,
    # A restart inside the allocation (a new srun step of the same job start) and its count.
    "in_allocation": BOOL,
    "relaunch": INT,
    "restart_cause": TEXT,
    # How it ended, in more words: the failed node checks, the signal or stop, the rank that
    # caused it (``job.attribution``), the ranks' exit code.
    "health": TEXT,
    "signal": TEXT,
    "culprit": TEXT,
    "causes": OBJECTS,
    "exit_code": INT,
    # What the watchdog and the guard saw of a dying allocation.
    "dead_nodes": STRINGS,
    "dead_why": TEXT,
    "guard": TEXT,
    "shrunk": TEXT,  # fewer nodes than nodes.count (nodes.min): the global batch changed
    "resume_checkpoint": TEXT,  # a trainer's own checkpoint the ranks resume from
    "preflight": OBJECTS,  # the preflight verdicts per node
    "checkpoint_errors": OBJECTS,  # saves that failed while training went on
    # fault_tolerance.mode: replica_groups: each group restarted alone in this attempt
    # (each a ``store.group_restarts.GroupRestart``: group, cause, culprit, nodes, the decision).
    "group_restarts": GROUP_RESTARTS,
    # fault_tolerance.restart: in_process: each in-process restart in this attempt, written by
    # the ranks (each a ``store.inprocess.InProcessRestart``), and when rank 0 saw every rank of the
    # last generation return from the training function (the end hook then knows that
    # srun's nonzero status is a replaced rank's, not the run's).
    "in_process_restarts": RESTARTS,
    "in_process_done": NUMBER,
    # What happened after the attempt had ended, to the requeue it was waiting for (a cancel):
    # said here because the attempt's own ending is never rewritten (``ENDING``).
    "then": TEXT,
}

# The fields that say how an attempt ended. Once an attempt is closed they are final: a later
# writer (a cancel, a second concluder, a requeue's record) may add fields, never change
# these, so that a node failure is never rewritten as the cancel that came after it.
ENDING = ("end", "cause", "decision", "committed_step", "blamed", "culprit")


@dataclass(frozen=True, kw_only=True)
class AttemptRecord(records.Record):
    """One attempt (see the module's doc): an attribute per ``FIELDS`` entry
    (``records.Record``: None where the record has none, ``extra`` and ``nulls``; ``end``
    absent: the attempt is open, null: it ended at a time not known)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = ATTEMPTS_FILE

    attempt: int | None = None
    job_id: str | None = None
    restart_count: int | None = None
    nodes: str | None = None
    batch_host: str | None = None
    start: float | None = None
    end: float | None = None
    cause: str | None = None
    decision: str | None = None
    resumed_from: int | None = None
    committed_step: int | None = None
    blamed: tuple[str, ...] | None = None
    log_offset: int | None = None
    in_allocation: bool | None = None
    relaunch: int | None = None
    restart_cause: str | None = None
    health: str | None = None
    signal: str | None = None
    culprit: str | None = None
    causes: tuple[Mapping[str, Any], ...] | None = None
    exit_code: int | None = None
    dead_nodes: tuple[str, ...] | None = None
    dead_why: str | None = None
    guard: str | None = None
    shrunk: str | None = None
    resume_checkpoint: str | None = None
    preflight: tuple[Mapping[str, Any], ...] | None = None
    checkpoint_errors: tuple[Mapping[str, Any], ...] | None = None
    group_restarts: tuple[GroupRestart, ...] | None = None
    in_process_restarts: tuple[InProcessRestart, ...] | None = None
    in_process_done: float | None = None
    then: str | None = None

    @property
    def is_open(self) -> bool:
        return self.end is None and "end" not in self.nulls

    @property
    def cut_off(self) -> bool:
        """Open, but over: ddlaunch's guard requeued its job after the batch host was lost
        (``guard``), and only the next start of the job would close it. Its ending is that
        node failure, whoever closes it (``end_last``)."""
        return self.is_open and bool(self.guard)

    @property
    def key(self) -> str:
        """``AttemptId.key`` of the attempt."""
        return key_of(self.job_id or "", self.restart_count or 0, self.relaunch or 0)


# The batch script counts its restarts inside the allocation (new srun steps of one job start)
# in this variable; the ranks and the hooks read it to tell those attempts apart.
RELAUNCH_VAR = "DDLAUNCH_RELAUNCH"


@dataclass(frozen=True)
class AttemptId:
    """``job_id``: ``SLURM_JOB_ID`` (empty outside Slurm; the object's name in a Kubernetes
    pod), the name the batch-host records use; ``task``: the job as Slurm addresses it,
    ``ARRAY_TASK`` for an array task (what ``scontrol requeue`` must be given, what the
    ranks' failure records carry); ``restart``: ``SLURM_RESTART_COUNT``; ``relaunch``: the
    restarts inside this start of the job so far (``$DDLAUNCH_RELAUNCH``: Slurm's count does
    not move for those)."""

    job_id: str
    restart: int
    task: str = ""
    relaunch: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AttemptId:
        job_id = env.get("SLURM_JOB_ID", "")
        pod_job = env.get(KUBERNETES_JOB_VAR)
        if pod_job and not job_id:
            # A pod of --target kubernetes: the object's name (stable across restarts, as a
            # Slurm job id across requeues) and the attempt the pod entry worked out.
            return cls(pod_job, int(env.get(KUBERNETES_RESTART_VAR, "0") or 0), pod_job)
        array, index = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        # `scontrol requeue A` (the array's own id, which one task carries as SLURM_JOB_ID)
        # would requeue every task of the array (measured on 22.05.8): name the task.
        task = f"{array}_{index}" if array and index else job_id
        restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        return cls(job_id, restart, task, int(env.get(RELAUNCH_VAR, "0") or 0))

    @property
    def key(self) -> str:
        """The attempt in per-attempt file names: ``<job>-<restart>`` (``local`` outside
        Slurm), ``<job>-<restart>.<relaunch>`` for a restart inside the allocation."""
        return key_of(self.job_id or "local", self.restart, self.relaunch)

    def matches(self, record: Mapping[str, Any] | AttemptRecord) -> bool:
        """Whether a record of an attempt (``job_id``, ``restart_count``, ``relaunch``) is
        this attempt."""
        if isinstance(record, AttemptRecord):
            return (
                record.job_id == self.job_id
                and (record.restart_count or 0) == self.restart
                and (record.relaunch or 0) == self.relaunch
            )
        return (
            str(record.get("job_id")) == self.job_id
            and int(record.get("restart_count", 0) or 0) == self.restart
            and int(record.get("relaunch", 0) or 0) == self.relaunch
        )


def key_of(job_id: str, restart: int, relaunch: int = 0) -> str:
    return f"{job_id}-{restart}" + (f".{relaunch}" if relaunch else "")


def requeues(records: Sequence[AttemptRecord]) -> int:
    """Requeues so far: the attempts after the first that began a new start of the job."""
    return sum(1 for r in records[1:] if not r.in_allocation)


def restarts(records: Sequence[AttemptRecord]) -> int:
    """Restarts inside an allocation so far (new srun steps of a running job)."""
    return sum(1 for r in records if r.in_allocation)


def load(run_dir: Path) -> list[AttemptRecord]:
    """The attempt records; a file that cannot be used counts as none (``app.runs`` tells
    the user which and why), so that concluding an attempt never fails on it."""
    found, _ = records.load_json(run_dir / ATTEMPTS_FILE, list, [])
    return [
        AttemptRecord.from_json(r) for r in records.clean_items(found, FIELDS, ATTEMPTS_FILE)[0]
    ]


_ABSENT = object()  # a field a record lacks, unlike one it records as null


def keep_endings(
    written: Sequence[AttemptRecord], new: Sequence[AttemptRecord]
) -> list[AttemptRecord]:
    """``new`` with the ending (``ENDING``) of every attempt ``written`` has closed kept as
    it was written: a writer that loaded the records before another closed one, or that
    closes a closed one again, adds its fields but changes no ending. Records are matched by
    position and by their attempt (``key``); a field the closed record lacks may be added."""
    out = list(new)
    for i, (old, record) in enumerate(zip(written, new, strict=False)):
        if old.is_open or old.key != record.key or old.attempt != record.attempt:
            continue
        kept = {k: v for k, v in old.to_json().items() if k in ENDING}
        if any(record.to_json().get(k, _ABSENT) != v for k, v in kept.items()):
            out[i] = record.updated(**kept)
    return out


def save(run_dir: Path, attempts: Sequence[AttemptRecord]) -> None:
    """Write the records (temp name, fsync, rename); the endings already written stay
    (``keep_endings``), whoever writes."""
    kept = keep_endings(load(run_dir), attempts)
    fsutil.atomic_write_json(run_dir / ATTEMPTS_FILE, [a.to_json() for a in kept], 0o600)


def close(
    record: AttemptRecord, *, cause: str, committed_step: int | None, **extra: object
) -> AttemptRecord:
    """``record`` ended now (in memory; the caller saves)."""
    return record.updated(end=time.time(), cause=cause, committed_step=committed_step, **extra)


def end_last(run_dir: Path, *, cause: str, committed_step: int | None, **extra: object) -> bool:
    """Close the newest open attempt; False when there is none (closed already, or none).

    One the guard cut off (``AttemptRecord.cut_off``) ended in that node failure, as the
    next start would record it: it is closed so (the guard's words, the lost node blamed),
    and this later ending is kept as ``then`` (a cancel of the pending requeue)."""
    attempts = load(run_dir)
    if not attempts or not attempts[-1].is_open:
        return False
    last = attempts[-1]
    if last.cut_off:
        later = extra.get("decision") or cause
        attempts[-1] = close(
            last,
            cause=CAUSE_REQUEUED_BY_SLURM,
            committed_step=committed_step,
            decision=last.guard,
            blamed=list(last.dead_nodes or ()),
            then=str(later),
        )
    else:
        attempts[-1] = close(last, cause=cause, committed_step=committed_step, **extra)
    save(run_dir, attempts)
    return True


def update_open(run_dir: Path, **fields: object) -> bool:
    """Add ``fields`` to the newest attempt while it is open (e.g. its preflight verdicts)."""
    attempts = load(run_dir)
    if not attempts or not attempts[-1].is_open:
        return False
    attempts[-1] = attempts[-1].updated(**fields)
    save(run_dir, attempts)
    return True


def update_last(run_dir: Path, **fields: object) -> bool:
    """Add ``fields`` to the newest attempt, open or closed (what its requeue went through);
    a closed attempt's ending stays as it is (``save``)."""
    attempts = load(run_dir)
    if not attempts:
        return False
    attempts[-1] = attempts[-1].updated(**fields)
    save(run_dir, attempts)
    return True


def new_record(
    index: int, attempt: AttemptId, *, nodes: str, host: str, resumed_from: int | None
) -> AttemptRecord:
    return AttemptRecord.from_json(
        {
            "attempt": index,
            "job_id": attempt.job_id,
            "restart_count": attempt.restart,
            "nodes": nodes,
            "batch_host": host,
            "start": time.time(),
            "resumed_from": resumed_from,
            **({"in_allocation": True, "relaunch": attempt.relaunch} if attempt.relaunch else {}),
        }
    )
