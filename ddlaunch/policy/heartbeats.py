"""Heartbeat analysis (pure): is the attempt hung, is a node a straggler, and whom to blame.

Input: the ranks' heartbeat records (``ddlaunch.worker.heartbeat``), the clock, thresholds.
Output: a ``Finding`` or None. The watchdog adapter reads the files, keeps the little state
the straggler rule needs between polls (``slow_since``) and acts on the finding.

Hang: no rank finished a step for ``hang_timeout`` seconds. Blame, in order of evidence:
  1. ranks whose heartbeat file went stale (the writer thread stopped: the process is frozen);
  2. ranks that are behind the others' step (the others wait for them);
  3. ranks stuck outside any collective while their peers wait inside one.
The suspects' nodes are blamed only if some ranks do not look like suspects: when all look
alike (e.g. every rank waits in the same collective), no node is to blame and the attempt
ends without an exclusion.

Straggler: per node, the median busy time per step (step time minus the time spent waiting
in the step-boundary collective) of its ranks; a node whose busy time exceeds
``factor`` x the median of the *other* nodes for ``patience`` seconds is blamed. In a
synchronous job every rank's step time is the same (collectives align them), so only busy
time can tell the slow node from the ones that wait for it. The median of the others is read
off the nodes' busy times sorted once (leaving one value out shifts the middle by at most
one place), so a poll costs O(n log n) in the nodes, not O(n^2).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CAUSE_HANG = "hang"
CAUSE_STRAGGLER = "straggler"


@dataclass(frozen=True)
class Thresholds:
    hang_timeout: float
    heartbeat_interval: float
    straggler_factor: float
    straggler_patience: float

    @property
    def stale_after(self) -> float:
        # The writer thread beats every interval; three missed beats (and a little slack for
        # a loaded node or a slow shared filesystem) mean it is not running any more.
        return 3 * self.heartbeat_interval + 5


@dataclass(frozen=True)
class Finding:
    cause: str
    nodes: tuple[str, ...]
    detail: str
    ranks: tuple[int, ...] = ()


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
    def from_record(cls, rec: Mapping[str, Any]) -> Beat:
        return cls(
            rank=int(rec.get("rank", -1)),
            host=str(rec.get("host", "?")),
            step=rec.get("step"),
            step_wall=rec.get("step_wall"),
            beat=float(rec.get("beat", 0.0) or 0.0),
            state=str(rec.get("state", "running")),
            busy_time=rec.get("busy_time"),
            step_time=rec.get("step_time"),
            where=rec.get("where"),
            waiting=rec.get("waiting"),
            started=float(rec.get("started", 0.0) or 0.0),
        )


def current_beats(
    records: Iterable[Mapping[str, Any]],
    job_id: str,
    restart: int,
    not_before: float = 0.0,
    relaunch: int = 0,
) -> list[Beat]:
    """The records of this attempt only (files of earlier attempts stay on disk until the
    rank of the new attempt overwrites them). ``relaunch``: the restart inside the
    allocation (Slurm's restart count stays the same for those)."""
    out = []
    for rec in records:
        if str(rec.get("job_id", "")) != str(job_id) or int(rec.get("restart", 0) or 0) != restart:
            continue
        if int(rec.get("relaunch", 0) or 0) != relaunch:
            continue
        beat = Beat.from_record(rec)
        if beat.started >= not_before:
            out.append(beat)
    return sorted(out, key=lambda b: b.rank)


def _blame(suspects: Sequence[Beat], running: Sequence[Beat]) -> tuple[str, ...]:
    # Evidence is relative: some ranks look stuck while their peers look fine. When every
    # rank looks the same, nothing singles out a node.
    if not suspects or {b.rank for b in suspects} >= {b.rank for b in running}:
        return ()
    return tuple(sorted({b.host for b in suspects}))


def last_progress(beats: Sequence[Beat]) -> float | None:
    """When the running ranks last showed progress (their newest finished step, else their
    start): the time the hang rule counts from; None without a running rank."""
    running = [b for b in beats if b.state == "running"]
    if not running:
        return None
    return max((b.step_wall or b.started or b.beat) for b in running)


def frozen(beats: Sequence[Beat], now: float, t: Thresholds) -> list[Beat]:
    """The running ranks whose heartbeat went stale: their writer thread stopped."""
    return [b for b in beats if b.state == "running" and now - b.beat > t.stale_after]


def detect_hang(
    beats: list[Beat], now: float, t: Thresholds, expected_ranks: int | None = None
) -> Finding | None:
    last_step = last_progress(beats)
    if last_step is None:
        return None
    running = [b for b in beats if b.state == "running"]
    idle = now - last_step
    if idle < t.hang_timeout:
        return None
    stale = frozen(running, now, t)
    steps = [b.step for b in running if b.step is not None]
    top = max(steps) if steps else None
    behind = [b for b in running if top is not None and (b.step is None or b.step < top)]
    stuck = [b for b in running if b.waiting is False]
    waiting = [b for b in running if b.waiting]
    missing = ""
    if expected_ranks is not None and len(beats) < expected_ranks:
        missing = f"; {expected_ranks - len(beats)} rank(s) never sent a heartbeat"
    head = f"no step finished for {idle:.0f} s (hang_timeout {t.hang_timeout:.0f} s)"
    for suspects, why in (
        (stale, "heartbeat stopped (process frozen)"),
        (
            behind,
            f"behind at step {min((b.step or 0) for b in behind) if behind else ''}"
            f" while others reached {top}",
        ),
        (stuck if waiting else [], "stuck outside any collective while peers wait"),
    ):
        nodes = _blame(suspects, running)
        if nodes:
            where = next((b.where for b in suspects if b.where), None)
            detail = f"{head}; rank(s) {','.join(str(b.rank) for b in suspects)} {why}"
            detail += f" at {where}" if where else ""
            return Finding(CAUSE_HANG, nodes, detail + missing, tuple(b.rank for b in suspects))
    return Finding(CAUSE_HANG, (), f"{head}; no single node to blame{missing}")


@dataclass
class StragglerState:
    """What the straggler rule remembers between polls: since when each node is slow."""

    slow_since: dict[str, float] = field(default_factory=dict)


def node_busy_times(beats: list[Beat]) -> dict[str, float]:
    per_node: dict[str, list[float]] = {}
    for b in beats:
        if b.state == "running" and b.busy_time is not None and b.busy_time >= 0:
            per_node.setdefault(b.host, []).append(float(b.busy_time))
    return {host: statistics.median(times) for host, times in per_node.items()}


def slow_nodes(busy: Mapping[str, float], factor: float) -> dict[str, float]:
    """Node -> its busy time over the median of the other nodes, for nodes above ``factor``."""
    out: dict[str, float] = {}
    if len(busy) < 2:
        return out
    ordered = sorted(busy.values())
    for host, mine in busy.items():
        others = median_without(ordered, mine)
        if others > 0 and mine > factor * others:
            out[host] = mine / others
    return out


def median_without(ordered: Sequence[float], value: float) -> float:
    """The median of ``ordered`` (sorted, at least two values, ``value`` among them) with one
    ``value`` left out, as ``statistics.median`` of the rest would give it, in O(log n)."""
    gone = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def rest(i: int) -> float:  # the i-th value of the rest
        return ordered[i] if i < gone else ordered[i + 1]

    half = size // 2
    if size % 2:
        return rest(half)
    return (rest(half - 1) + rest(half)) / 2


def detect_straggler(
    beats: list[Beat],
    now: float,
    t: Thresholds,
    state: StragglerState,
    busy: Mapping[str, float] | None = None,
) -> Finding | None:
    """``busy``: ``node_busy_times(beats)`` where the caller has it already (one pass over
    16,000 beats a poll, not two)."""
    busy = node_busy_times(beats) if busy is None else busy
    slow = slow_nodes(busy, t.straggler_factor)
    for host in list(state.slow_since):
        if host not in slow:
            del state.slow_since[host]
    for host in slow:
        state.slow_since.setdefault(host, now)
    blamed = sorted(h for h in slow if now - state.slow_since[h] >= t.straggler_patience)
    if not blamed or set(blamed) >= set(busy):
        return None
    parts = [
        f"{h} busy {busy[h]:.3f} s/step = {slow[h]:.1f}x the other nodes' median "
        f"for {now - state.slow_since[h]:.0f} s"
        for h in blamed
    ]
    return Finding(
        CAUSE_STRAGGLER,
        tuple(blamed),
        "; ".join(parts) + f" (straggler_factor {t.straggler_factor})",
    )


def analyse(
    beats: list[Beat],
    now: float,
    t: Thresholds,
    state: StragglerState,
    expected_ranks: int | None = None,
    busy: Mapping[str, float] | None = None,
) -> Finding | None:
    return detect_hang(beats, now, t, expected_ranks) or detect_straggler(
        beats, now, t, state, busy
    )


def summary(
    beats: list[Beat], now: float, busy: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """A few numbers for ``status``: latest step, oldest heartbeat, busy time per node."""
    busy = node_busy_times(beats) if busy is None else busy
    running = [b for b in beats if b.state == "running"]
    steps = [b.step for b in beats if b.step is not None]
    return {
        "ranks": len(beats),
        "running": len(running),
        "step": max(steps) if steps else None,
        "oldest_beat_age": round(max((now - b.beat for b in running), default=0.0), 1),
        "busy_per_node": {h: round(v, 4) for h, v in sorted(busy.items())},
        "time": now,
    }
