"""The heartbeat analysis's inputs (pure): one rank's beat, and one node's summary of its ranks.

A ``NodeSummary`` holds what the watchdog decides a healthy node from, so that it reads one
small record per node a cycle instead of decoding every rank's: how many ranks ran, the span
of their steps, when the node last made progress, its oldest and newest beat, how many ranks
wait in a collective or are stuck outside one, and its median busy time. The node's leader
rank computes it when it merges its ranks' beats (``worker.heartbeat``); the watchdog reads
a node's rank records only when the summary makes the node a suspect (``suspect_hosts``).
Every analysis over summaries gives the verdict the same analysis over the ranks gives: each
field is a min, max, count or the per-node median those analyses read.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Beat:
    """The fields of one heartbeat record that the analysis reads."""

    rank: int
    host: str
    step: int | None
    step_wall: float | None
    beat: float
    state: str = "running"
    busy_time: float | None = None
    step_time: float | None = None
    where: str | None = None
    waiting: bool | None = None
    started: float = 0.0

    @classmethod
    def from_record(cls, rec: Mapping[str, object]) -> Beat:
        """The beat of one rank's record as read (``store.heartbeats.RankBeat``); a field of
        the wrong kind reads as absent."""
        return cls(
            rank=_count(rec.get("rank"), -1),
            host=str(rec.get("host", "?")),
            step=_whole(rec.get("step")),
            step_wall=_time(rec.get("step_wall")),
            beat=_float(rec.get("beat")),
            state=str(rec.get("state", "running")),
            busy_time=_time(rec.get("busy_time")),
            step_time=_time(rec.get("step_time")),
            where=_text(rec.get("where")),
            waiting=_flag(rec.get("waiting")),
            started=_float(rec.get("started")),
        )

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def progress(self) -> float:
        """When this rank last moved: its last step, else its start, else its beat."""
        return self.step_wall or self.started or self.beat


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: object, default: int = 0) -> int:
    """A whole number of a record (a rank, a restart count): absent or null is ``default``,
    one that is not a number -1 (no rank, no attempt)."""
    if value is None or value == "":
        return default
    if isinstance(value, int | float | str):
        try:
            return int(value)
        except ValueError:
            pass
    return -1


def _float(value: object) -> float:
    """A time of a record: absent, null or not a number is 0."""
    if value and isinstance(value, int | float | str):
        try:
            return float(value)
        except ValueError:
            pass
    return 0.0


def same_attempt(rec: Mapping[str, object], job_id: str, restart: int, relaunch: int) -> bool:
    """Whether a record (a rank's, or a node record's head) belongs to this attempt.
    ``relaunch``: the restart inside the allocation (Slurm's restart count stays the same)."""
    return (
        str(rec.get("job_id", "")) == str(job_id)
        and _count(rec.get("restart")) == restart
        and _count(rec.get("relaunch")) == relaunch
    )


def current_beats(
    records: Iterable[Mapping[str, object]],
    job_id: str,
    restart: int,
    not_before: float = 0.0,
    relaunch: int = 0,
) -> list[Beat]:
    """The records of this attempt only (files of earlier attempts stay on disk until the
    rank of the new attempt overwrites them), in rank order."""
    out = []
    for rec in records:
        if not same_attempt(rec, job_id, restart, relaunch):
            continue
        beat = Beat.from_record(rec)
        if beat.started >= not_before:
            out.append(beat)
    return sorted(out, key=lambda b: b.rank)


@dataclass(slots=True)
class NodeSummary:
    """One node's ranks, reduced to what the watchdog's verdicts read. "Running": the ranks
    whose state is ``running`` (a closed rank is neither hung nor slow). Not frozen: a frozen
    dataclass is built five times slower, and a cycle builds 2,000 of them."""

    host: str
    ranks: int  # records, whatever their state
    running: int
    first_started: float  # the earliest start of any rank (the attempt filter's test)
    step: int | None = None  # the newest step of any rank
    top: int | None = None  # the newest step of a running rank
    low: int | None = None  # the oldest step of a running rank that stepped
    unstepped: int = 0  # running ranks without a step yet
    progress: float | None = None  # the latest ``Beat.progress`` of a running rank
    oldest_beat: float | None = None  # of a running rank
    newest_beat: float | None = None  # of a running rank
    waiting: int = 0  # running ranks waiting inside a collective
    stuck: int = 0  # running ranks known to be outside any collective
    busy: float | None = None  # the median busy time of its running ranks, s/step

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> NodeSummary | None:
        """None unless every field is there with a plausible type (a record of another
        version: the reader then summarises the ranks themselves)."""
        try:
            summary = cls(**data)  # type: ignore[arg-type]  # the kinds are checked below
        except TypeError:  # a field missing, or one this version does not know
            return None
        counts = (summary.ranks, summary.running, summary.unstepped, summary.waiting)
        times = (summary.progress, summary.oldest_beat, summary.newest_beat, summary.busy)
        steps = (summary.step, summary.top, summary.low)
        if not (
            isinstance(summary.host, str)
            and all(type(c) is int for c in (*counts, summary.stuck))
            and all(t is None or isinstance(t, int | float) for t in (*times, *steps))
            and isinstance(summary.first_started, int | float)
        ):
            return None  # the analysis would fail on it: summarised from the ranks instead
        return summary


def summarise(host: str, beats: Sequence[Beat]) -> NodeSummary:
    """The summary of one node's beats (``beats``: that node's only)."""
    running = [b for b in beats if b.running]
    steps = [b.step for b in beats if b.step is not None]
    run_steps = [b.step for b in running if b.step is not None]
    busy = [float(b.busy_time) for b in running if b.busy_time is not None and b.busy_time >= 0]
    return NodeSummary(
        host=host,
        ranks=len(beats),
        running=len(running),
        first_started=min((b.started for b in beats), default=0.0),
        step=max(steps) if steps else None,
        top=max(run_steps) if run_steps else None,
        low=min(run_steps) if run_steps else None,
        unstepped=len(running) - len(run_steps),
        progress=max((b.progress for b in running), default=None),
        oldest_beat=min((b.beat for b in running), default=None),
        newest_beat=max((b.beat for b in running), default=None),
        waiting=sum(1 for b in running if b.waiting),
        stuck=sum(1 for b in running if b.waiting is False),
        busy=statistics.median(busy) if busy else None,
    )


def by_node(beats: Iterable[Beat]) -> list[NodeSummary]:
    """One summary per host of these beats, in host order."""
    hosts: dict[str, list[Beat]] = {}
    for b in beats:
        hosts.setdefault(b.host, []).append(b)
    return [summarise(h, hosts[h]) for h in sorted(hosts)]
