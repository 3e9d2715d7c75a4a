"""How often to checkpoint (pure): the Young-Daly interval, the expected ETTR of an interval,
and a simulator of a run under a failure schedule that checks both.

The model (one blocking cost per checkpoint, failures at random):

* training runs in segments: ``interval`` seconds of steps, then ``save`` seconds in which
  the loop is blocked by the checkpoint (for an async save, only its stall);
* failures arrive as a Poisson process of mean ``mttf`` seconds during the steps and the
  saves; each loses the work since the last completed checkpoint and costs ``restart``
  seconds (detection, new step or requeue, start-up) before training resumes. Failures
  during a restart are not modelled apart: they lengthen the same recovery.

The expected time of one segment is then exactly (mttf + restart) * (e^((interval + save) /
mttf) - 1) (a segment is retried until it runs through; renewal-reward over segments), so the
ETTR (effective training time ratio: useful training time / wall time) is ``interval`` over
that. Its first-order expansion, save/interval + interval/(2 mttf) lost, is minimised at
Young's interval sqrt(2 save mttf) (Young 1974; Daly 2006 refines it for restart costs and
large ratios), which is what ``young_daly`` gives; ``best_interval`` minimises the exact form.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


def young_daly(save_s: float, mttf_s: float) -> float:
    """The checkpoint interval sqrt(2 * C * MTTF) in seconds."""
    if save_s <= 0 or mttf_s <= 0:
        raise ValueError("the save cost and the MTTF must be positive")
    return math.sqrt(2.0 * save_s * mttf_s)


def expected_ettr(interval_s: float, save_s: float, restart_s: float, mttf_s: float) -> float:
    """The long-run ETTR of checkpointing every ``interval_s`` seconds of training."""
    if interval_s <= 0 or mttf_s <= 0:
        raise ValueError("the interval and the MTTF must be positive")
    segment = (mttf_s + restart_s) * math.expm1((interval_s + save_s) / mttf_s)
    return interval_s / segment


def best_interval(save_s: float, restart_s: float, mttf_s: float) -> float:
    """The interval that maximises ``expected_ettr`` (golden-section search: the ETTR is
    unimodal in the interval)."""
    lo, hi = 1e-3 * young_daly(save_s, mttf_s), 10.0 * young_daly(save_s, mttf_s) + save_s
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(200):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if expected_ettr(a, save_s, restart_s, mttf_s) < expected_ettr(
            b, save_s, restart_s, mttf_s
        ):
            lo = a
        else:
            hi = b
    return (lo + hi) / 2.0


def exponential_failures(mttf_s: float, seed: int) -> Iterator[float]:
    """An endless failure schedule: times (s of wall time) with exponential gaps of mean
    ``mttf_s``, reproducible from ``seed``."""
    rng = random.Random(seed)
    now = 0.0
    while True:
        now += rng.expovariate(1.0 / mttf_s)
        yield now


@dataclass(frozen=True)
class Simulated:
    wall_s: float
    work_s: float
    failures: int
    saves_s: float  # wall time spent in saves that completed
    restarts_s: float  # wall time spent restarting
    lost_s: float  # training (and saves) redone after failures

    @property
    def ettr(self) -> float:
        return self.work_s / self.wall_s


def simulate(
    work_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    failures: Iterator[float],
) -> Simulated:
    """Run ``work_s`` seconds of training checkpointed every ``interval_s`` under the
    failure times ``failures`` (ascending wall times; those falling inside a restart are
    skipped, see the module doc). The last segment may be shorter and ends with a save.
    The segments that run through before the next failure are taken at once, so the cost is
    per failure, not per segment (a search over intervals simulates millions of segments)."""
    now = done = saves = restarts = lost = 0.0
    count = 0
    next_failure = next(failures)
    cycle = interval_s + save_s
    while done < work_s - 1e-9:
        whole = (work_s - done) // interval_s
        if next_failure - now < whole * cycle:  # (never true when no failure comes: inf)
            whole = (next_failure - now) // cycle
        if whole >= 1:
            now, done = now + whole * cycle, done + whole * interval_s
            saves += whole * save_s
            continue
        segment = min(interval_s, work_s - done)
        end = now + segment + save_s
        if next_failure >= end:
            now, done, saves = end, done + segment, saves + save_s
            continue
        count += 1
        lost += next_failure - now
        now = next_failure + restart_s
        restarts += restart_s
        while next_failure <= now:  # (<=: with no restart cost, the failure itself)
            next_failure = next(failures)
    return Simulated(now, work_s, count, saves, restarts, lost)
