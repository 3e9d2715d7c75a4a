"""Time to train a fixed number of samples when extra replica groups fill the cluster's idle
holes (pure): a seeded simulation of a tidal data-parallel width against the fixed width.

The job's own ``groups`` replica groups (the core, the fixed width) always step. Beside them
the cluster has idle holes, each big enough for one more group of ``group_gpus`` GPUs:

* holes arrive as a Poisson process and each lasts an exponential time of mean ``hole_s``
  before the cluster's own work preempts it (an M/M/inf queue): on average ``idle_fraction``
  of ``cluster_gpus`` is idle, in holes. The run starts with the stationary number of holes.
  The holes are drawn by thinning one stream of the whole cluster's (``idle_fraction`` 1):
  for a seed, the holes at a lower fraction are a subset of those at a higher one, so that
  runs at different fractions compare hole for hole;
* a hole (while fewer than ``max_extra`` extra groups are joining or live) starts an extra
  group: after ``join_s`` (its job's start-up and its heal from a live peer) it joins at a
  step boundary and the live groups block ``join_stall_s`` (the quorum's change, the heal's
  transfer); a hole preempted before that costs the others nothing;
* a joined group steps until its hole is preempted; then the live groups block ``leave_s``
  (the lighthouse's heartbeat timeout and the step in flight, which torchft discards and the
  next committed step trains: ``policy.tidal_batches``);
* blocks queue one after another; between them the live groups train at ``rate(width)``.

The batch policies (``policy.tidal_batches``): with ``PerGroup`` each group trains ``batch``
samples a step of ``step_s`` whatever the width, so the rate grows with the width. With
``FixedGlobal`` the step's samples stay ``batch`` and each group's share (its largest:
``ceil(batch / width)``) shrinks; the step shrinks with it, except ``fixed_share`` of the
fixed-width step (the cross-group all-reduce, the optimizer step, a small batch's lower
efficiency), which does not.

The output is the wall time to train ``samples`` samples against the fixed width's
``samples / rate(groups)``. It counts samples, not progress: a larger global batch
(``PerGroup``) may need more samples to reach the same loss, which the model leaves out, as it
leaves out the core groups' own failures (``policy.replica_sim``). Every default below is an
assumption, not a measurement.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ddlaunch.policy.tidal_batches import FixedGlobal, PerGroup


@dataclass(frozen=True, kw_only=True)
class Scenario:
    groups: int  # the job's own replica groups: the fixed width
    group_gpus: int  # GPUs of one replica group; a hole holds one extra group
    policy: FixedGlobal | PerGroup  # the batch policy (its batch in samples)
    cluster_gpus: int  # the cluster whose idle holes extra groups run in
    idle_fraction: float  # the mean share of cluster_gpus idle, in holes (0..1)
    hole_s: float = 1800.0  # a hole's mean life until the cluster's own work takes it back
    step_s: float = 5.0  # a step at the fixed width
    fixed_share: float = 0.2  # FixedGlobal: the share of the step that does not shrink
    join_s: float = 180.0  # an extra group's start-up and heal: hole -> stepping
    join_stall_s: float = 5.0  # the live groups' block when a group joins
    leave_s: float = 10.0  # the live groups' block when a joined group is preempted
    max_extra: int | None = None  # extra groups joining or live at once (None: no limit)

    def __post_init__(self) -> None:
        if self.groups < 1 or self.group_gpus < 1:
            raise ValueError("groups and group_gpus must be at least 1")
        if self.cluster_gpus < 0:
            raise ValueError(f"cluster_gpus cannot be negative, got {self.cluster_gpus}")
        if not 0.0 <= self.idle_fraction <= 1.0:
            raise ValueError(f"idle_fraction must be 0..1, got {self.idle_fraction}")
        if not 0.0 <= self.fixed_share <= 1.0:
            raise ValueError(f"fixed_share must be 0..1, got {self.fixed_share}")
        if self.hole_s <= 0 or self.step_s <= 0:
            raise ValueError("the hole's life and the step must be positive")
        if min(self.join_s, self.join_stall_s, self.leave_s) < 0:
            raise ValueError("the join and leave costs cannot be negative")
        if self.max_extra is not None and self.max_extra < 0:
            raise ValueError(f"max_extra cannot be negative, got {self.max_extra}")

    @property
    def cluster_groups(self) -> int:
        """Holes the whole cluster would hold if it were all idle."""
        return self.cluster_gpus // self.group_gpus

    def rate(self, width: int) -> float:
        """Samples per second with ``width`` groups live."""
        total = self.policy.total(width)
        if isinstance(self.policy, PerGroup):
            return total / self.step_s
        largest = -(-total // width)  # shares(total, width)[0], the step's longest share
        fixed = -(-total // self.groups)
        step = self.step_s * (self.fixed_share + (1.0 - self.fixed_share) * largest / fixed)
        return total / step


@dataclass(frozen=True, kw_only=True)
class Hole:
    """An idle hole: from ``start`` to ``end`` (seconds of the run)."""

    start: float
    end: float


@dataclass(frozen=True, kw_only=True)
class Result:
    wall_s: float  # time to train the samples
    fixed_s: float  # the same samples at the fixed width
    joins: int  # extra groups that joined
    leaves: int  # joined groups preempted before the end
    lost_joins: int  # holes preempted before their group joined
    blocked_s: float  # wall time the live groups were blocked by joins and leaves
    extra_s: float  # extra groups stepping x seconds
    joining_s: float  # extra groups starting or healing x seconds

    @property
    def speedup(self) -> float:
        return self.fixed_s / self.wall_s

    @property
    def mean_extra(self) -> float:
        """Extra groups live on average."""
        return self.extra_s / self.wall_s


def holes(s: Scenario, seed: int) -> Iterator[Hole]:
    """The holes of ``s`` under ``seed``, by start (endless when the fraction is positive).
    Every hole of the whole cluster is drawn with a uniform number and kept when it falls
    below ``idle_fraction`` (the module doc's thinning)."""
    rng = random.Random(f"tidal-sim-{seed}")
    full = s.cluster_groups  # mean holes with the whole cluster idle
    if full == 0 or s.idle_fraction == 0.0:
        return
    initial = 0  # Poisson(full): unit-rate arrivals within [0, full)
    clock = rng.expovariate(1.0)
    while clock < full:
        initial += 1
        clock += rng.expovariate(1.0)
    for _ in range(initial):  # memoryless: each lasts a fresh exponential time
        keep, life = rng.random(), rng.expovariate(1.0 / s.hole_s)
        if keep < s.idle_fraction:
            yield Hole(start=0.0, end=life)
    now = 0.0
    while True:
        now += rng.expovariate(full / s.hole_s)
        keep, life = rng.random(), rng.expovariate(1.0 / s.hole_s)
        if keep < s.idle_fraction:
            yield Hole(start=now, end=now + life)


_ENDS, _JOINED = 0, 1  # at the same time a hole ends before its group joins


class _Run:
    """One run's state; ``run`` drives it."""

    def __init__(self, s: Scenario, samples: float, holes: Iterable[Hole]) -> None:
        self.s, self.samples = s, samples
        self.holes = iter(holes)
        self.next_hole = next(self.holes, None)
        self.events: list[tuple[float, int, int]] = []  # (time, seq, kind): a heap
        self.joined: dict[int, bool] = {}  # a hole's group: joined or starting (gone: absent)
        self.seq = 0
        self.now = self.done = self.block = self.blocked = 0.0
        self.extra = self.joining = 0
        self.joins = self.leaves = self.lost = 0
        self.extra_s = self.joining_s = 0.0

    def next_time(self) -> float:
        event = self.events[0][0] if self.events else math.inf
        return min(event, self.next_hole.start if self.next_hole else math.inf)

    def advance(self, until: float) -> bool:
        """Train up to ``until``; whether the samples are done (``now`` is then the end)."""
        dt = until - self.now
        blocked = min(self.block, dt)
        self.block -= blocked
        self.blocked += blocked
        rate = self.s.rate(self.s.groups + self.extra)
        stepping = dt - blocked
        finished = self.done + stepping * rate >= self.samples
        if finished:
            stepping = (self.samples - self.done) / rate
            until = self.now + blocked + stepping
        self.extra_s += (until - self.now) * self.extra
        self.joining_s += (until - self.now) * self.joining
        self.now = until
        self.done = self.samples if finished else self.done + stepping * rate
        return finished

    def event(self) -> None:
        """What happens at ``now``: a hole opens, a group joins, or a hole is preempted."""
        if self.next_hole is not None and self.next_hole.start <= self.now:
            hole, self.next_hole = self.next_hole, next(self.holes, None)
            cap = self.s.max_extra
            if cap is None or self.extra + self.joining < cap:
                self.seq += 1
                self.joining += 1
                self.joined[self.seq] = False
                heapq.heappush(self.events, (self.now + self.s.join_s, self.seq, _JOINED))
                heapq.heappush(self.events, (hole.end, self.seq, _ENDS))
            return
        _, seq, kind = heapq.heappop(self.events)
        state = self.joined.get(seq)
        if kind == _JOINED and state is False:
            self.joined[seq] = True
            self.joining -= 1
            self.extra += 1
            self.joins += 1
            self.block += self.s.join_stall_s
        elif kind == _ENDS and state:
            del self.joined[seq]
            self.extra -= 1
            self.leaves += 1
            self.block += self.s.leave_s
        elif kind == _ENDS:  # preempted while starting or healing
            del self.joined[seq]
            self.joining -= 1
            self.lost += 1

    def result(self) -> Result:
        return Result(
            wall_s=self.now,
            fixed_s=fixed_time(self.s, self.samples),
            joins=self.joins,
            leaves=self.leaves,
            lost_joins=self.lost,
            blocked_s=self.blocked,
            extra_s=self.extra_s,
            joining_s=self.joining_s,
        )


def fixed_time(s: Scenario, samples: float) -> float:
    """Seconds to train ``samples`` at the fixed width."""
    return samples / s.rate(s.groups)


def run(s: Scenario, samples: float, holes: Iterable[Hole]) -> Result:
    """Train ``samples`` samples with extra groups in ``holes`` (ascending starts; a hole
    ending at or before its group would join costs the others nothing)."""
    if samples <= 0:
        raise ValueError(f"samples must be positive, got {samples}")
    state = _Run(s, samples, holes)
    while not state.advance(state.next_time()):
        state.event()
    return state.result()


def simulate(s: Scenario, samples: float, seed: int) -> Result:
    """``run`` under the holes of ``seed``."""
    return run(s, samples, holes(s, seed))


def simulated(s: Scenario, samples: float, seeds: int, first: int = 0) -> list[Result]:
    """One result per seed ``first..first+seeds-1``."""
    return [simulate(s, samples, seed) for seed in range(first, first + seeds)]
