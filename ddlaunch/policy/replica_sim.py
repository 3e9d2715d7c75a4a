"""Goodput of replica groups beside a whole-job restart (pure): a failure simulator and the
closed-form expectation it is checked against.

The job's GPUs are split into ``groups`` replica groups of whole nodes (HSDP's replicas,
``fault_tolerance.mode: replica_groups``); each group is a fault domain. The model extends
``interval``'s (whose failure schedule and ETTR it reuses):

* failures arrive as a Poisson process of the job's MTTF (the per-GPU MTTF over the GPUs), each
  on a node drawn uniformly, so every group fails independently at its share of the rate;
* a failure of a live group that leaves at least ``min_groups`` live is taken by the group:
  it is down for ``group_restart_s`` (kill -> back in the quorum, its heal from a live peer
  included) and the survivors block for ``stall_s`` (the lighthouse's heartbeat timeout)
  plus ``lost_steps`` steps of ``step_s`` (the step in flight, redone); blocks queue one
  after another. A group's failure while it is down lengthens the same recovery (skipped);
* while ``live`` of the groups step, useful samples accrue at ``live / groups`` of the
  uninterrupted rate (each live group does its share of the batch);
* checkpoints: every ``interval_s`` seconds of stepping the live groups block ``save_s``;
* a failure that leaves fewer than ``min_groups`` live is a whole-job failure (today's path):
  the work since the last completed checkpoint is lost and every group is back after
  ``job_restart_s``; failures during it are skipped, as in ``interval.simulate``;
* spares: with ``spare_nodes`` unset a restarted group always finds a node (most failures
  are the software's, and a requeue gets fresh nodes); with a pool, the failed node is away
  for ``repair_s`` and a group waits for a free node (first come first served) before its
  restart. A whole-job restart is the requeue path: a new allocation, its pool full.

Goodput = useful samples / (wall time x the uninterrupted rate). The wall time is split,
in capacity (a group's share of the wall time), into the work kept, the saves, the stalls,
the steps redone, the capacity of groups that are down (``degraded``), the whole-job
restarts and the work they lost: the seven add up to the wall time.

The closed form (``expected``): between whole-job failures, the number ``d`` of groups down
is taken at the stationary law of ``groups`` independent sources failing at rate ``lam``
each while up, down a fixed time ``r``: P(d) proportional to C(groups, d) (lam r)^d for
d <= groups - min_groups (the Engset law, insensitive to the restart time's distribution).
Groups fail at (groups - d) lam, a failure at d = groups - min_groups is a whole-job failure
(rate ``nu``); the rest are absorbed, each blocking the live groups for b = stall + redone. In
running time the live capacity is A = E[groups - d] / groups, of which kappa goes to blocks;
the rest steps and saves as interval : save, so a segment of running time T = (interval +
save) / (1 - beta) (beta = the blocked share of the wall time) yields (A - kappa) interval /
(interval + save) T of work, and whole-job failures at rate nu retry it as in
``interval.expected_ettr``. It is exact when every failure is a whole-job one (``min_groups ==
groups``: ``interval``'s model) and, to first order in blocks that overlap, when whole-job
failures are rare (the simulation agrees within its noise: tests/test_replica_sim.py). Where
they are frequent it is conservative: it takes their rate at the stationary law, while a
restart brings every group back and the next one comes later (4 groups, min 1, a group
down for 2.5 group MTTFs: 37 % against a simulated 48 %).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from ddlaunch.policy import interval
from ddlaunch.wording import counted, plural


@dataclass(frozen=True, kw_only=True)
class Scenario:
    gpus: int  # GPUs of the job
    gpus_per_node: int
    groups: int  # replica groups of whole nodes (1: the whole job is one fault domain)
    gpu_mttf_s: float  # one GPU's mean time to failure (the job's MTTF x its GPUs); inf: none
    interval_s: float  # seconds of stepping between checkpoints
    save_s: float  # seconds the live groups block per checkpoint
    job_restart_s: float  # a whole-job failure -> every group stepping again
    group_restart_s: float  # a group's kill -> the group back in the quorum, healed
    stall_s: float = 0.0  # the survivors' block per group failure (heartbeat timeout)
    step_s: float = 0.0  # seconds per step (for lost_steps)
    lost_steps: float = 0.0  # steps the survivors redo per group failure
    min_groups: int = 1  # fewer live groups than this is a whole-job failure
    spare_nodes: int | None = None  # the spare pool; None: a node is always there
    repair_s: float = 0.0  # a failed node's time away from the pool (with spare_nodes)

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1 or self.groups < 1:
            raise ValueError("gpus, gpus_per_node and groups must be at least 1")
        if self.gpus % (self.gpus_per_node * self.groups):
            raise ValueError(
                f"{counted(self.gpus, 'GPU')} {plural(self.gpus, 'does', 'do')} not split "
                f"into {counted(self.groups, 'group')} of whole "
                f"{self.gpus_per_node}-GPU nodes"
            )
        if not 1 <= self.min_groups <= self.groups:
            raise ValueError(f"min_groups must be 1..{self.groups}, got {self.min_groups}")
        if self.gpu_mttf_s <= 0 or self.interval_s <= 0:
            raise ValueError("the MTTF and the checkpoint interval must be positive")
        costs = (self.save_s, self.job_restart_s, self.group_restart_s, self.stall_s)
        if min(*costs, self.step_s, self.lost_steps, self.repair_s) < 0:
            raise ValueError("costs, steps and the repair time cannot be negative")
        if self.spare_nodes is not None and self.spare_nodes < 0:
            raise ValueError(f"spare_nodes cannot be negative, got {self.spare_nodes}")
        if self.stall_s + self.redone_s >= self.job_mttf_s:
            # Blocks would queue faster than they pass: training would never go on.
            raise ValueError("a group failure's stall and steps redone outlast the job's MTTF")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def job_mttf_s(self) -> float:
        return self.gpu_mttf_s / self.gpus

    @property
    def group_mttf_s(self) -> float:
        return self.gpu_mttf_s * self.groups / self.gpus

    @property
    def redone_s(self) -> float:
        """The survivors' steps redone per group failure, in seconds."""
        return self.lost_steps * self.step_s


def gpu_mttf(job_mttf_s: float, gpus: int) -> float:
    """The per-GPU MTTF of a job of ``gpus`` GPUs whose MTTF is ``job_mttf_s`` (failures
    independent, so rates add)."""
    return job_mttf_s * gpus


@dataclass(frozen=True)
class Run:
    """A simulated run, or the sum of several; all in seconds of full capacity."""

    wall_s: float
    work_s: float  # useful samples / the uninterrupted rate
    failures: int  # group failures the groups took
    job_failures: int  # whole-job failures
    saves_s: float  # completed saves
    stalls_s: float  # the survivors blocked by a heartbeat timeout
    redone_s: float  # the survivors' steps redone
    degraded_s: float  # groups down while the others step
    restarts_s: float  # whole-job restarts
    lost_s: float  # work (and saves in progress) lost to whole-job failures

    @property
    def goodput(self) -> float:
        return self.work_s / self.wall_s

    def share(self, seconds: float) -> float:
        return seconds / self.wall_s

    def __add__(self, other: Run) -> Run:
        return Run(
            self.wall_s + other.wall_s,
            self.work_s + other.work_s,
            self.failures + other.failures,
            self.job_failures + other.job_failures,
            self.saves_s + other.saves_s,
            self.stalls_s + other.stalls_s,
            self.redone_s + other.redone_s,
            self.degraded_s + other.degraded_s,
            self.restarts_s + other.restarts_s,
            self.lost_s + other.lost_s,
        )


def job_failures(s: Scenario, seed: int) -> Iterator[float]:
    """The job-wide failure times of ``s`` (``interval``'s schedule at the job's MTTF)."""
    if math.isinf(s.gpu_mttf_s):
        return itertools.repeat(math.inf)
    return interval.exponential_failures(s.job_mttf_s, seed)


# What the live groups are doing.
_STEP, _SAVE, _STALL, _REDO = range(4)
_EPS = 1e-9


class _Simulation:
    """One run's state; ``simulate`` drives it (split so that each step reads on its own)."""

    def __init__(self, s: Scenario, work_s: float, seed: int) -> None:
        self.s, self.work_s = s, work_s
        self.failures = job_failures(s, seed)
        self.nodes = random.Random(f"replica-sim-nodes-{seed}")
        self.next_failure, self.node = next(self.failures), self.nodes.randrange(s.nodes)
        self.now = self.done = self.committed = self.pending = 0.0
        self.saves = self.stalls = self.redone = self.degraded = 0.0
        self.restarts = self.lost = 0.0
        self.count = self.whole = 0
        self.live = s.groups
        self.seg_left, self.save_left = s.interval_s, 0.0
        self.stall_left = self.redo_left = 0.0
        self.down: set[int] = set()
        self.returns: list[tuple[float, int]] = []  # (time back in the quorum, group)
        self.free = s.spare_nodes
        self.repairs: deque[float] = deque()  # nodes' return times (ascending: one repair)
        self.waiting: deque[int] = deque()  # groups waiting for a node

    def activity(self) -> tuple[int, float]:
        """What the live groups do next, and for how long at most."""
        if self.stall_left > 0:
            return _STALL, self.stall_left
        if self.redo_left > 0:
            return _REDO, self.redo_left
        if self.save_left > 0 or self.seg_left <= 0:
            return _SAVE, self.save_left
        rate = self.live / self.s.groups
        return _STEP, min(self.seg_left, (self.work_s - self.done) / rate)

    def next_event(self) -> float:
        event = min(self.next_failure, self.returns[0][0] if self.returns else math.inf)
        return min(event, self.repairs[0]) if self.repairs else event

    def advance(self, doing: int, dt: float) -> None:
        g = self.s.groups
        self.degraded += dt * (g - self.live) / g
        capacity = dt * self.live / g
        if doing == _STEP:
            self.seg_left -= dt
            self.done += capacity
        elif doing == _SAVE:
            self.save_left -= dt
            self.pending += capacity
        elif doing == _STALL:
            self.stall_left -= dt
            self.stalls += capacity
        else:
            self.redo_left -= dt
            self.redone += capacity
        self.now += dt

    def finish(self, doing: int) -> bool:
        """The activity ran through; whether the run is over (its last save done)."""
        if doing == _STALL:
            self.stall_left = 0.0
        elif doing == _REDO:
            self.redo_left = 0.0
        elif doing == _STEP:
            if self.work_s - self.done <= _EPS * max(1.0, self.work_s):
                self.done, self.seg_left = self.work_s, 0.0
            if self.seg_left <= _EPS * self.s.interval_s:
                self.seg_left, self.save_left = 0.0, self.s.save_s
        else:
            self.committed, self.saves = self.done, self.saves + self.pending
            self.pending = self.save_left = 0.0
            if self.done >= self.work_s:
                return True
            self.seg_left = self.s.interval_s
        return False

    def event(self) -> None:
        """What happens at ``now``: a node back from repair, a group back, or a failure."""
        if self.repairs and self.repairs[0] <= self.now:
            self.repairs.popleft()
            if self.waiting:
                self.restart_group(self.waiting.popleft())
            elif self.free is not None:
                self.free += 1
            return
        if self.returns and self.returns[0][0] <= self.now:
            _, group = heapq.heappop(self.returns)
            self.down.discard(group)
            self.live += 1
            return
        group = self.node // (self.s.nodes // self.s.groups)
        if group in self.down:
            pass  # it lengthens the same recovery
        elif self.live - 1 >= self.s.min_groups:
            self.group_fails(group)
        else:
            self.job_fails()
        while True:  # the next failure (<=: with no restart cost, the failure itself)
            self.next_failure, self.node = next(self.failures), self.nodes.randrange(self.s.nodes)
            if self.next_failure > self.now:
                return

    def restart_group(self, group: int) -> None:
        heapq.heappush(self.returns, (self.now + self.s.group_restart_s, group))

    def group_fails(self, group: int) -> None:
        self.count += 1
        self.live -= 1
        self.down.add(group)
        self.stall_left += self.s.stall_s
        self.redo_left += self.s.redone_s
        if self.free is None:
            self.restart_group(group)
            return
        self.repairs.append(self.now + self.s.repair_s)
        if self.free > 0:
            self.free -= 1
            self.restart_group(group)
        else:
            self.waiting.append(group)

    def job_fails(self) -> None:
        s = self.s
        self.whole += 1
        self.lost += self.done - self.committed + self.pending
        self.done, self.pending = self.committed, 0.0
        self.seg_left, self.save_left = s.interval_s, 0.0
        self.stall_left = self.redo_left = 0.0
        self.now += s.job_restart_s
        self.restarts += s.job_restart_s
        self.live = s.groups
        self.returns.clear()
        self.waiting.clear()
        self.down.clear()
        # The requeue's allocation: its own nodes and a full pool of spares.
        self.repairs.clear()
        self.free = s.spare_nodes

    def result(self) -> Run:
        return Run(
            self.now,
            self.committed,
            self.count,
            self.whole,
            self.saves,
            self.stalls,
            self.redone,
            self.degraded,
            self.restarts,
            self.lost,
        )


def simulate(s: Scenario, work_s: float, seed: int) -> Run:
    """Run ``work_s`` seconds of uninterrupted training of ``s`` under the failures of
    ``seed`` (their times from ``job_failures``, their nodes from a generator of its own, so
    that runs with different groups share the times). The last segment may be shorter and
    ends with a save. With one group, or ``min_groups == groups``, it is
    ``interval.simulate`` on the same schedule. One loop turn per event or activity."""
    run = _Simulation(s, work_s, seed)
    while True:
        doing, length = run.activity()
        event = run.next_event()
        if run.now + length <= event:  # (a failure at an activity's end comes after it)
            run.advance(doing, length)
            if run.finish(doing):
                return run.result()
        else:
            run.advance(doing, event - run.now)
            run.now = event  # (exactly: the event's own test compares times)
            run.event()


def simulated(s: Scenario, seeds: int = 20, mttfs: float = 100.0, first: int = 0) -> Run:
    """The sum of ``seeds`` runs (seeds first..first+seeds-1) of ``mttfs`` job MTTFs of
    training each (10 days each without failures)."""
    work = mttfs * s.job_mttf_s if math.isfinite(s.gpu_mttf_s) else 864_000.0
    runs = [simulate(s, work, seed) for seed in range(first, first + seeds)]
    total = runs[0]
    for run in runs[1:]:
        total = total + run
    return total


@dataclass(frozen=True)
class Expected:
    """The closed form's shares of the wall time (they add up to 1)."""

    goodput: float
    saves: float
    stalls: float
    redone: float
    degraded: float
    restarts: float
    lost: float
    job_mttf_s: float  # running time between whole-job failures (inf: none)


def expected(s: Scenario) -> Expected:
    """The closed-form expectation of ``simulate``'s shares (see the module doc). A pool of
    spares that can run dry has none: it needs ``spare_nodes`` unset or 0 (then a group is
    down for its node's repair and its restart)."""
    if s.spare_nodes not in (None, 0):
        raise ValueError("no closed form with a pool of spares: simulate it")
    g, low = s.groups, s.min_groups
    if math.isinf(s.gpu_mttf_s):
        share = s.interval_s / (s.interval_s + s.save_s)
        return Expected(share, 1.0 - share, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf)
    lam = 1.0 / s.group_mttf_s
    down_s = s.group_restart_s + (s.repair_s if s.spare_nodes == 0 else 0.0)
    weights = [math.comb(g, d) * (lam * down_s) ** d for d in range(g - low + 1)]
    law = [w / sum(weights) for w in weights]
    live = sum(p * (g - d) for d, p in enumerate(law)) / g
    absorbed = [(g - d) * lam * p for d, p in enumerate(law)][:-1]  # d < g - low
    nu = low * lam * law[-1]
    if nu * (s.interval_s + s.save_s) < 1e-15:
        nu = 0.0  # below a float's resolution of the goodput (and 1 / nu may overflow)
    block = s.stall_s + s.redone_s
    beta = sum(absorbed) * block
    # Capacity per block: the survivors', and the failed group's where it is back before
    # the block ends (then it waits with them: a failure costs the block whatever the groups).
    survivors = sum(f * (g - d - 1) / g for d, f in enumerate(absorbed))
    back_stalled = max(0.0, s.stall_s - down_s)
    back_redoing = max(0.0, block - down_s) - back_stalled
    stalls = survivors * s.stall_s + sum(absorbed) * back_stalled / g
    redone = survivors * s.redone_s + sum(absorbed) * back_redoing / g
    kappa = stalls + redone
    cycle = s.interval_s + s.save_s
    t = cycle / (1.0 - beta)  # running time of a segment that runs through
    if nu > 0:
        retries = math.expm1(nu * t)  # whole-job failures per segment kept
        wall = (1.0 / nu + s.job_restart_s) * retries
        running = retries / nu  # of which running (the rest: restarts)
    else:
        retries, wall, running = 0.0, t, t
    steps = (live - kappa) * s.interval_s / cycle
    saves = (live - kappa) * s.save_s / cycle
    if nu > 0:  # interval's ETTR over a segment stretched by the blocks, at the live capacity
        goodput = (live - kappa) * interval.expected_ettr(
            s.interval_s / (1.0 - beta), s.save_s / (1.0 - beta), s.job_restart_s, 1.0 / nu
        )
    else:
        goodput = steps
    return Expected(
        goodput=goodput,
        saves=saves * t / wall,
        stalls=stalls * running / wall,
        redone=redone * running / wall,
        degraded=(1.0 - live) * running / wall,
        restarts=s.job_restart_s * retries / wall,
        lost=(steps + saves) * (running - t) / wall,
        job_mttf_s=1.0 / nu if nu > 0 else math.inf,
    )
