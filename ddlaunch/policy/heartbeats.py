"""Heartbeat analysis (pure): is the attempt hung, is a node a straggler, and whom to blame.

Input: a summary per node (``policy.beats.NodeSummary``) and, for the nodes those make
suspects of a hang, their ranks' beats; the clock, thresholds. Output: a ``Finding`` or None.
The watchdog adapter reads the files, keeps the little state the straggler rule needs between
polls (``slow_since``) and acts on the finding. A healthy cycle at 2,000 nodes decides from
the 2,000 summaries alone; the functions over a list of beats (``detect_hang``, ``analyse``,
``summary``) summarise the beats first and give the same verdicts.

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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ddlaunch.config.health import HealthSpec
from ddlaunch.policy.beats import Beat, NodeSummary, by_node
from ddlaunch.policy.beats import current_beats as current_beats  # the callers' old name
from ddlaunch.wording import counted, plural

CAUSE_HANG = "hang"
CAUSE_STRAGGLER = "straggler"

# The beats of these nodes' ranks, in rank order (the adapter decodes them on demand).
RanksOf = Callable[[Sequence[str]], list[Beat]]


@dataclass(frozen=True)
class Thresholds:
    hang_timeout: float
    heartbeat_interval: float
    straggler_factor: float
    straggler_patience: float

    @classmethod
    def of(cls, health: HealthSpec) -> Thresholds:
        """The config's ``health`` limits: the one place they become thresholds."""
        return cls(
            hang_timeout=health.hang_timeout,
            heartbeat_interval=health.heartbeat_interval,
            straggler_factor=health.straggler_factor,
            straggler_patience=health.straggler_patience,
        )

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


def _ranks_among(beats: Sequence[Beat]) -> RanksOf:
    def ranks_of(hosts: Sequence[str]) -> list[Beat]:
        wanted = set(hosts)
        return [b for b in beats if b.host in wanted]

    return ranks_of


def _blame(suspects: Sequence[Beat], running: int) -> tuple[str, ...]:
    # Evidence is relative: some ranks look stuck while their peers look fine. When every
    # running rank looks the same, nothing singles out a node.
    if not suspects or len({b.rank for b in suspects}) >= running:
        return ()
    return tuple(sorted({b.host for b in suspects}))


def last_progress(beats: Sequence[Beat]) -> float | None:
    """When the running ranks last showed progress (their newest finished step, else their
    start): the time the hang rule counts from; None without a running rank."""
    return max((b.progress for b in beats if b.running), default=None)


def frozen(beats: Sequence[Beat], now: float, t: Thresholds) -> list[Beat]:
    """The running ranks whose heartbeat went stale: their writer thread stopped."""
    return [b for b in beats if b.running and now - b.beat > t.stale_after]


def hang_idle(nodes: Iterable[NodeSummary], now: float, t: Thresholds) -> float | None:
    """Seconds since any running rank last finished a step, when that is ``hang_timeout``
    or more (the attempt is hung); None otherwise or without a running rank."""
    progress = [n.progress for n in nodes if n.running and n.progress is not None]
    if not progress:
        return None
    idle = now - max(progress)
    return idle if idle >= t.hang_timeout else None


def _top(nodes: Iterable[NodeSummary]) -> int | None:
    return max((n.top for n in nodes if n.top is not None), default=None)


def suspect_hosts(nodes: Sequence[NodeSummary], now: float, t: Thresholds) -> list[str]:
    """The nodes holding a rank that one of the hang's rules could blame: a stale beat, a
    step behind the newest (or none yet), or a rank outside any collective while others
    wait in one. Only these nodes' ranks are read to explain a hang."""
    top = _top(nodes)
    waiting = any(n.waiting for n in nodes)
    out = []
    for n in nodes:
        if not n.running:
            continue
        stale = n.oldest_beat is not None and now - n.oldest_beat > t.stale_after
        behind = top is not None and (n.unstepped > 0 or (n.low is not None and n.low < top))
        if stale or behind or (waiting and n.stuck > 0):
            out.append(n.host)
    return out


def detect_hang(
    beats: list[Beat], now: float, t: Thresholds, expected_ranks: int | None = None
) -> Finding | None:
    return hang_in(by_node(beats), _ranks_among(beats), now, t, expected_ranks)


def hang_in(
    nodes: Sequence[NodeSummary],
    ranks_of: RanksOf,
    now: float,
    t: Thresholds,
    expected_ranks: int | None = None,
) -> Finding | None:
    """The hang rule over node summaries; ``ranks_of`` is asked for the suspects' ranks only
    when the attempt is hung."""
    idle = hang_idle(nodes, now, t)
    if idle is None:
        return None
    hosts = suspect_hosts(nodes, now, t)
    beats = sorted((b for b in ranks_of(hosts) if b.running), key=lambda b: b.rank) if hosts else []
    running = sum(n.running for n in nodes)
    stale = [b for b in beats if now - b.beat > t.stale_after]
    top = _top(nodes)
    behind = [b for b in beats if top is not None and (b.step is None or b.step < top)]
    stuck = [b for b in beats if b.waiting is False]
    waiting = any(n.waiting for n in nodes)
    heard = sum(n.ranks for n in nodes)
    missing = ""
    if expected_ranks is not None and heard < expected_ranks:
        missing = f"; {counted(expected_ranks - heard, 'rank')} never sent a heartbeat"
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
        blamed = _blame(suspects, running)
        if blamed:
            where = next((b.where for b in suspects if b.where), None)
            ranks = ",".join(str(b.rank) for b in suspects)
            detail = f"{head}; {plural(len(suspects), 'rank')} {ranks} {why}"
            detail += f" at {where}" if where else ""
            return Finding(CAUSE_HANG, blamed, detail + missing, tuple(b.rank for b in suspects))
    return Finding(CAUSE_HANG, (), f"{head}; no single node to blame{missing}")


def partly_stale(nodes: Iterable[NodeSummary], now: float, stale_after: float) -> bool:
    """Some running ranks' beats went stale while others' did not (a node that vanished
    without closing its connections)."""
    running = [n for n in nodes if n.running and n.oldest_beat is not None]
    some = any(now - (n.oldest_beat or 0.0) > stale_after for n in running)
    every = all(now - (n.newest_beat or 0.0) > stale_after for n in running)
    return some and not every


@dataclass
class StragglerState:
    """What the straggler rule remembers between polls: since when each node is slow."""

    slow_since: dict[str, float] = field(default_factory=dict)


def node_busy_times(beats: list[Beat]) -> dict[str, float]:
    return node_busy(by_node(beats))


def node_busy(nodes: Iterable[NodeSummary]) -> dict[str, float]:
    """Node -> the median busy time of its running ranks (nodes without one left out)."""
    return {n.host: n.busy for n in nodes if n.busy is not None}


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
) -> Finding | None:
    return straggler_in(node_busy_times(beats), now, t, state)


def straggler_in(
    busy: Mapping[str, float], now: float, t: Thresholds, state: StragglerState
) -> Finding | None:
    """The straggler rule over each node's median busy time (``node_busy``)."""
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
) -> Finding | None:
    return analyse_nodes(by_node(beats), _ranks_among(beats), now, t, state, expected_ranks)


def analyse_nodes(
    nodes: Sequence[NodeSummary],
    ranks_of: RanksOf,
    now: float,
    t: Thresholds,
    state: StragglerState,
    expected_ranks: int | None = None,
) -> Finding | None:
    return hang_in(nodes, ranks_of, now, t, expected_ranks) or straggler_in(
        node_busy(nodes), now, t, state
    )


def summary(beats: list[Beat], now: float, left_out: Collection[str] = ()) -> dict[str, object]:
    return summary_of(by_node(beats), now, left_out)


def summary_of(
    nodes: Sequence[NodeSummary], now: float, left_out: Collection[str] = ()
) -> dict[str, object]:
    """A few numbers for ``status``: latest step, oldest heartbeat, busy time per node.

    ``left_out``: the nodes the run no longer counts (``store.exclusions``). A node that died
    under an in-process restart keeps its last record, "running" at the step it died in,
    while its ranks train on a spare: its beats only age, and counted they made the oldest
    beat grow as if the training stalled."""
    if left_out:
        gone = set(left_out)
        nodes = [n for n in nodes if n.host not in gone]
    steps = [n.step for n in nodes if n.step is not None]
    oldest = [n.oldest_beat for n in nodes if n.running and n.oldest_beat is not None]
    return {
        "ranks": sum(n.ranks for n in nodes),
        "running": sum(n.running for n in nodes),
        "step": max(steps) if steps else None,
        "oldest_beat_age": round(now - min(oldest), 1) if oldest else 0.0,
        "busy_per_node": {h: round(v, 4) for h, v in sorted(node_busy(nodes).items())},
        "time": now,
    }
