"""``ddlaunch advise``: how often a run should checkpoint, from what it measured.

The inputs come from the run directory: the stall of each checkpoint save and the first step
of each attempt (``store.timings``, written by rank 0 of Session code), the attempts (how each
ended, when), and the MTTF (``fault_tolerance.mttf_hours``, else the run's own failures per
hour of attempts). The arithmetic is ``policy.interval``'s: the interval of highest ETTR in
its model (``best_interval``, not Young-Daly's first-order sqrt(2 C MTTF), which is 4 % too
long at C = 30 s and a 1 h MTTF and 15 % at C = 300 s, where the simulated optimum agrees with
``best_interval``: tests/test_interval_optimum.py), and the exact ETTR of an interval. Login
node: reads files, no torch.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.checkpoint import adapters
from ddlaunch.config.trainers import is_byo
from ddlaunch.errors import UserError
from ddlaunch.policy import interval
from ddlaunch.policy import requeue as causes
from ddlaunch.store import attempts as attempts_store
from ddlaunch.store import timings
from ddlaunch.store.attempts import AttemptRecord
from ddlaunch.store.inprocess import recovered_count
from ddlaunch.store.rundir import checkpoint_source, read_config_tree
from ddlaunch.store.timings import Timing
from ddlaunch.wording import counted, plural

# Endings that are failures (the MTTF counts them; a restart cost follows them). A signal is
# the planned stop at the time limit, a preflight failure comes before any training.
FAILURES = (
    causes.CAUSE_CRASH,
    causes.CAUSE_NODE_FAILURE,
    causes.CAUSE_REQUEUED_BY_SLURM,
    causes.CAUSE_HANG,
    causes.CAUSE_STRAGGLER,
)


def advised_interval(save_s: float, restart_s: float, mttf_s: float) -> float:
    """The checkpoint interval advised for these costs: the model's optimum."""
    return interval.best_interval(save_s, restart_s, mttf_s)


@dataclass(frozen=True)
class Measured:
    value: float
    source: str  # where the figure comes from, as the output says it


@dataclass(frozen=True)
class Advice:
    save: Measured  # blocking cost per checkpoint, seconds
    restart: Measured  # seconds from a failed attempt's end to the next attempt's first step
    mttf: Measured  # seconds
    step_s: Measured  # seconds of training per step
    current_s: float  # seconds of training between checkpoints now
    current_steps: float

    @property
    def advised_s(self) -> float:
        return advised_interval(self.save.value, self.restart.value, self.mttf.value)

    @property
    def advised_steps(self) -> int:
        return max(1, round(self.advised_s / self.step_s.value))

    def ettr(self, every_s: float) -> float:
        return interval.expected_ettr(every_s, self.save.value, self.restart.value, self.mttf.value)


@dataclass(frozen=True)
class Save:
    """A measured checkpoint save (a ``timings.SAVE`` line with every field it needs)."""

    step: int
    time: float
    blocking_s: float
    stall_s: float
    async_save: bool
    attempt: str | None


def _saves(records: Sequence[Timing]) -> list[Save]:
    saves = [
        Save(r.step, r.time, r.blocking_s, r.stall_s, bool(r.async_save), r.attempt)
        for r in records
        if r.kind == timings.SAVE
        and r.step is not None
        and r.time is not None
        and r.blocking_s is not None
        and r.stall_s is not None
    ]
    return sorted(saves, key=lambda r: r.time)


def save_cost(records: Sequence[Timing]) -> Measured | None:
    saves = _saves(records)
    if not saves:
        return None
    stall = statistics.fmean(r.stall_s for r in saves)
    blocking = statistics.fmean(r.blocking_s for r in saves)
    how = "async" if all(r.async_save for r in saves) else "sync"
    detail = f"{how}: blocking {blocking:.3f} s + waiting for the copy {stall - blocking:.3f} s"
    return Measured(stall, f"stall per save, mean of {counted(len(saves), 'save')} ({detail})")


def spacing(records: Sequence[Timing]) -> tuple[float, float, int] | None:
    """(seconds of training per step, steps between saves, pairs): from consecutive saves
    of one attempt, the wall time between them less the first one's stall."""
    saves = _saves(records)
    per_step, steps = [], []
    for a, b in itertools.pairwise(saves):
        gap = b.step - a.step
        if a.attempt != b.attempt or gap <= 0:
            continue
        per_step.append((b.time - a.time - a.stall_s) / gap)
        steps.append(gap)
    if not per_step:
        return None
    return statistics.median(per_step), statistics.median(steps), len(per_step)


def restart_cost(attempts: Sequence[AttemptRecord], records: Sequence[Timing]) -> Measured:
    first = {
        str(r.attempt): r.time
        for r in records
        if r.kind == timings.FIRST_STEP and r.time is not None
    }
    costs = []
    for before, after in itertools.pairwise(attempts):
        began = first.get(after.key)
        if before.cause in FAILURES and before.end and began is not None:
            costs.append(began - before.end)
    if not costs:
        return Measured(0.0, "not measured (no failure was followed by a first step): 0 assumed")
    n = len(costs)
    return Measured(
        statistics.fmean(costs),
        f"failed attempt's end -> next attempt's first step, mean of {counted(n, 'restart')}",
    )


# Below this many failures the run's own MTTF is said to be an uncertain estimate.
FEW_FAILURES = 3


def mttf(tree: Mapping[str, Any], attempts: Sequence[AttemptRecord], now: float) -> Measured | None:
    hours = (tree.get("fault_tolerance") or {}).get("mttf_hours")
    if hours:
        return Measured(float(hours) * 3600.0, "fault_tolerance.mttf_hours")
    spent = sum(float(a.end or now) - a.start for a in attempts if a.start)
    # A replica group that failed and was restarted alone is a failure of the job's hardware
    # or code as much as a whole attempt's end; so is a rank a standby replaced in process
    # (one that fell back ended its attempt, whose cause counts it already).
    failed = sum(1 for a in attempts if a.cause in FAILURES)
    failed += sum(len(a.group_restarts or ()) for a in attempts)
    failed += recovered_count(attempts)
    if not failed or spent <= 0:
        return None
    few = (
        f"; {'one failure makes' if failed == 1 else f'{failed} failures make'} an uncertain "
        "estimate: --mttf-hours sets one"
        if failed < FEW_FAILURES
        else ""
    )
    return Measured(
        spent / failed,
        f"{counted(failed, 'failure')} in {spent / 3600:.2f} h of attempts (this run{few})",
    )


# The saves that are no periodic one (``timings``' ``reason``), as the output names them.
UNMEASURED = {"signal": "on the stop signal", "final": "at the last step"}


def _unmeasured(record: Timing) -> str:
    at = f"step {record.step}" if record.step is not None else "a step not recorded"
    return f"{at}, {UNMEASURED.get(str(record.reason), 'with no cost recorded')}"


def no_save_measured(run_dir: Path, records: Sequence[Timing] = ()) -> str:
    """Why there is no save cost to advise on: none yet, only saves that are no periodic
    one (``records``: the run's timings; a run cancelled before its first periodic save has
    the save on the stop signal only), or a trainer that does not say."""
    unmeasured = [r for r in records if r.kind == timings.SAVE]
    if unmeasured:
        n = len(unmeasured)
        return (
            f"run {run_dir.name} measured no periodic checkpoint save yet: "
            f"{timings.TIMINGS_FILE} has {counted(n, 'save')} "
            f"({'; '.join(_unmeasured(r) for r in unmeasured)}), which advise leaves out: a "
            "save on a stop signal or at the last step blocks the loop by design, so it says "
            "nothing of what a periodic save costs"
        )
    try:
        source = checkpoint_source(run_dir)
    except UserError:  # the config is damaged (status says so): the general answer
        source = None
    if source is not None and is_byo(source.kind):
        saved = sum(1 for c in adapters.scan(source.root, source.layout) if c.complete)
        have = f"it has {counted(saved, 'checkpoint')}, but " if saved else ""
        return (
            f"run {run_dir.name}: {have}its trainer (trainer.kind: {source.kind}) records no "
            f"save stall ({timings.TIMINGS_FILE} is written by Session code), so there is no "
            "save cost to advise on"
        )
    return (
        f"run {run_dir.name} measured no checkpoint save yet ({timings.TIMINGS_FILE}: Session "
        "code records each one)"
    )


def advise_run(
    run_dir: Path, now: float | None = None, mttf_override: float | None = None
) -> Advice:
    """``mttf_override``: hours (``--mttf-hours``), before the config's and the run's."""
    records = timings.read(run_dir)
    attempts = attempts_store.load(run_dir)
    name = run_dir.name
    save = save_cost(records)
    if save is None:
        raise UserError(no_save_measured(run_dir, records))
    spaced = spacing(records)
    if spaced is None:
        raise UserError(
            f"run {name} needs two periodic saves in one attempt to measure its step time "
            "(the final save and the one on a stop signal are not periodic)"
        )
    step_s, steps, pairs = spaced
    if mttf_override is not None:
        failures: Measured | None = Measured(mttf_override * 3600.0, "--mttf-hours")
    else:
        failures = mttf(read_config_tree(run_dir), attempts, time.time() if now is None else now)
    if failures is None:
        raise UserError(
            f"run {name} has had no failure to estimate an MTTF from: set "
            f"fault_tolerance.mttf_hours, or give one: ddlaunch advise {name} --mttf-hours 24"
        )
    return Advice(
        save=save,
        restart=restart_cost(attempts, records),
        mttf=failures,
        step_s=Measured(step_s, f"median of {counted(pairs, 'interval')} between saves"),
        current_s=step_s * steps,
        current_steps=steps,
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def lines(run_id: str, a: Advice) -> list[str]:
    """What ``ddlaunch advise`` prints."""
    now, advised = a.ettr(a.current_s), a.ettr(a.advised_s)
    return [
        f"run {run_id}: checkpoint interval",
        f"  save cost C     {_duration(a.save.value):>9}  {a.save.source}",
        f"  restart cost R  {_duration(a.restart.value):>9}  {a.restart.source}",
        f"  MTTF            {_duration(a.mttf.value):>9}  {a.mttf.source}",
        f"  step time       {_duration(a.step_s.value):>9}  {a.step_s.source}",
        f"  now:      every {a.current_steps:g} {plural(a.current_steps, 'step')} "
        f"({_duration(a.current_s)})"
        f", predicted ETTR {now:.2%}",
        f"  advised:  every {counted(a.advised_steps, 'step')} ({_duration(a.advised_s)}, "
        f"the model's optimum), predicted ETTR {advised:.2%}",
        f"  to use it: --set fault_tolerance.checkpoint_every_steps={a.advised_steps}",
    ]
