"""Checkpoint-interval advice: the Young-Daly interval and the ETTR of its model (pure), the
simulator of a run under exponential failures agreeing with that ETTR, and ``ddlaunch
advise`` as a user reads it (the whole output, from a run directory's measured costs)."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support.rundirs import write_attempts

from ddlaunch.policy import interval
from ddlaunch.store import timings
from ddlaunch.store.rundir import RunDir


def test_young_daly_and_the_exact_optimum_of_the_model() -> None:
    assert interval.young_daly(30.0, 3600.0) == pytest.approx(math.sqrt(2 * 30 * 3600))
    # First order: the exact optimum is Young's when C << MTTF and moves below it as C grows.
    small = interval.best_interval(1.0, 0.0, 86400.0)
    assert small == pytest.approx(interval.young_daly(1.0, 86400.0), rel=0.01)
    assert interval.best_interval(300.0, 0.0, 3600.0) < interval.young_daly(300.0, 3600.0)
    # The ETTR falls with a costlier restart and is at its highest at the optimum.
    best = interval.best_interval(30.0, 60.0, 3600.0)
    top = interval.expected_ettr(best, 30.0, 60.0, 3600.0)
    assert interval.expected_ettr(best, 30.0, 600.0, 3600.0) < top
    assert interval.expected_ettr(best * 0.5, 30.0, 60.0, 3600.0) < top
    assert interval.expected_ettr(best * 2.0, 30.0, 60.0, 3600.0) < top
    with pytest.raises(ValueError):
        interval.young_daly(0.0, 3600.0)


@pytest.mark.parametrize(
    ("save", "restart", "mttf", "every"),
    [
        (30.0, 60.0, 3600.0, None),  # at Young-Daly
        (5.0, 120.0, 1800.0, 600.0),  # far from it: saving too rarely
        (60.0, 600.0, 7.9 * 3600, None),  # Kokolis et al.'s 1,024-GPU MTTF
        (2.0, 30.0, 600.0, 10.0),  # saving too often
    ],
)
def test_simulator_agrees_with_the_analytic_ettr(save, restart, mttf, every) -> None:
    every = every or interval.young_daly(save, mttf)
    runs = [
        interval.simulate(50 * mttf, every, save, restart, interval.exponential_failures(mttf, s))
        for s in range(60)
    ]
    simulated = statistics.fmean(r.ettr for r in runs)
    analytic = interval.expected_ettr(every, save, restart, mttf)
    assert abs(simulated - analytic) / analytic < 0.02, (simulated, analytic)
    assert sum(r.failures for r in runs) > 60 * 30  # failures did happen, many
    for r in runs:  # the wall time is all accounted for
        assert r.wall_s == pytest.approx(r.work_s + r.saves_s + r.restarts_s + r.lost_s)


def test_simulator_without_failures_pays_the_saves_only() -> None:
    never = iter([math.inf])
    run = interval.simulate(1000.0, 100.0, 5.0, 60.0, never)
    assert (run.failures, run.wall_s, run.ettr) == (0, 1050.0, 1000.0 / 1050.0)


T0 = 1_790_000_000.0


def measured_run(root: Path, config: str) -> Path:
    """A run as Session code leaves it: 2 attempts (the first crashed and was restarted in
    the allocation), a save every 20 steps of 0.5 s, 0.2 s stall each."""
    run = RunDir.create(root, "r1")
    run.write_text("config.yaml", config)
    write_attempts(
        run.path,
        [
            {"attempt": 0, "job_id": "7", "restart_count": 0, "start": T0, "end": T0 + 70.0,
             "cause": "crash"},
            {"attempt": 1, "job_id": "7", "restart_count": 0, "relaunch": 1,
             "in_allocation": True, "start": T0 + 71.0, "end": T0 + 7271.0,
             "cause": "completed"},
        ],
    )  # fmt: skip
    timings.append(run.path, timings.FIRST_STEP, step=1, time=T0 + 12.0, attempt="7-0")
    for i in range(3):
        timings.append(
            run.path, timings.SAVE, step=20 * (i + 1), time=T0 + 12 + 10.2 * (i + 1),
            blocking_s=0.15, stall_s=0.2, async_save=True, attempt="7-0",
        )  # fmt: skip
    timings.append(run.path, timings.FIRST_STEP, step=61, time=T0 + 78.5, attempt="7-0.1")
    return run.path


def advise_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100", "DDLAUNCH_RUN_ROOT": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", "advise", *args],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def test_advise_whole_output(tmp_path) -> None:
    measured_run(tmp_path, "fault_tolerance: {mttf_hours: 2.0}\n")
    proc = advise_cli(tmp_path, "r1")
    assert proc.returncode == 0, proc.stderr
    # C = 0.2 s, MTTF = 7200 s: Daly's expansion of the model's optimum, sqrt(2 C MTTF)
    # (1 + sqrt(C / 2 MTTF) / 3 + C / 18 MTTF) - C = 53.67 * 1.00124 - 0.2 = 53.5 s (Young's
    # 53.7 s) = 107 steps of 0.5 s. ETTR at 20 steps (10 s): 1 - C/10 - (10/2 + R)/MTTF
    # ~ 97.8 %; at 53.5 s ~ 99.1 % (exact form).
    assert proc.stdout == (
        "run r1: checkpoint interval\n"
        "  save cost C         0.2 s  stall per save, mean of 3 saves (async: blocking 0.150 s"
        " + waiting for the copy 0.050 s)\n"
        "  restart cost R      8.5 s  failed attempt's end -> next attempt's first step,"
        " mean of 1 restart\n"
        "  MTTF               2.00 h  fault_tolerance.mttf_hours\n"
        "  step time           0.5 s  median of 2 intervals between saves\n"
        "  now:      every 20 steps (10 s), predicted ETTR 97.85%\n"
        "  advised:  every 107 steps (53.5 s, the model's optimum), predicted ETTR 99.14%\n"
        "  to use it: --set fault_tolerance.checkpoint_every_steps=107\n"
    )
    assert proc.stderr == ""


def test_advise_mttf_from_the_runs_own_failures_or_the_command_line(tmp_path) -> None:
    measured_run(tmp_path, "fault_tolerance: {max_requeues: 3}\n")
    # One failure in 7270 s of attempts (70 + 7200).
    proc = advise_cli(tmp_path, "r1")
    assert proc.returncode == 0, proc.stderr
    assert (
        "  MTTF               2.02 h  1 failure in 2.02 h of attempts (this run; one failure "
        "makes an uncertain estimate: --mttf-hours sets one)\n" in proc.stdout
    )
    proc = advise_cli(tmp_path, "r1", "--mttf-hours", "0.5")
    assert "  MTTF             30.0 min  --mttf-hours\n" in proc.stdout
    # Daly: sqrt(2 * 0.2 * 1800) = 26.83 s, * (1 + 0.00351) - 0.2 = 26.72 s = 53.4 steps
    # (Young's 26.8 s would be 54).
    assert "  to use it: --set fault_tolerance.checkpoint_every_steps=53\n" in proc.stdout


def test_advise_says_what_it_lacks(tmp_path) -> None:
    run = RunDir.create(tmp_path, "r2")
    run.write_text("config.yaml", "fault_tolerance: {max_requeues: 3}\n")
    proc = advise_cli(tmp_path, "r2")
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr == (
        "error: run r2 measured no checkpoint save yet (timings.jsonl: Session code records "
        "each one)\n"
    )
    timings.append(run.path, timings.SAVE, step=20, time=T0, blocking_s=0.1, stall_s=0.1,
                   async_save=False, attempt="7-0")  # fmt: skip
    timings.append(run.path, timings.SAVE, step=40, time=T0 + 10, blocking_s=0.1, stall_s=0.1,
                   async_save=False, attempt="7-0")  # fmt: skip
    proc = advise_cli(tmp_path, "r2")
    assert proc.stderr == (
        "error: run r2 has had no failure to estimate an MTTF from: set "
        "fault_tolerance.mttf_hours, or give one: ddlaunch advise r2 --mttf-hours 24\n"
    )


def test_advise_after_a_cancel_names_the_save_it_leaves_out(tmp_path) -> None:
    """Issue #51: a run cancelled before its first periodic save has one save, the one on the
    stop signal, which has no cost to measure: advise says so rather than "no save yet"."""
    from support.rundirs import make_run

    attempts = [{"attempt": 0, "job_id": "5", "restart_count": 0, "start": T0,
                 "end": T0 + 400.0, "cause": "cancelled"}]  # fmt: skip
    run = make_run(
        tmp_path, "r3", "5", T0, attempts=attempts, cancel=True,
        outcome=("CANCELLED", "cancelled, saved step 766"),
    )  # fmt: skip
    # What Session code writes on the stop signal (``_note_save``): when, not what it cost.
    timings.append(run, timings.SAVE, step=766, time=T0 + 390.0, reason="signal",
                   attempt="5-0")  # fmt: skip
    proc = advise_cli(tmp_path, "r3")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: run r3 measured no periodic checkpoint save yet: timings.jsonl has 1 save "
        "(step 766, on the stop signal), which advise leaves out: a save on a stop signal or "
        "at the last step blocks the loop by design, so it says nothing of what a periodic "
        "save costs\n"
    )


def test_advise_on_a_trainer_that_records_no_save_says_so(tmp_path) -> None:
    # An HF Trainer run with 2 complete checkpoints (and one it left incomplete): the saves
    # happened, ddlaunch just cannot time them.
    run = RunDir.create(tmp_path, "hf1")
    run.write_text(
        "config.yaml",
        f"launch: {{script: train.py}}\ntrainer: {{kind: hf, checkpoint_dir: {run.path}/out}}\n",
    )
    for step, complete in ((100, True), (200, True), (300, False)):
        folder = run.path / "out" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
        if not complete:
            (folder / "checkpoint-is-incomplete.txt").write_text("")
    proc = advise_cli(tmp_path, "hf1")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: run hf1: it has 2 checkpoints, but its trainer (trainer.kind: hf) records no "
        "save stall (timings.jsonl is written by Session code), so there is no save cost to "
        "advise on\n"
    )


def test_the_final_save_is_recorded_for_the_report_and_left_out_of_the_measured_saves(
    tmp_path: Path,
) -> None:
    """A Session run whose last step is no multiple of the interval saves it at close: the
    line says when and why, without the cost fields that only periodic saves measure."""
    from support.rundirs import loaded_run_dir

    from ddlaunch.app.advise import _saves
    from ddlaunch.launch.local import run_local

    run = loaded_run_dir(
        tmp_path / "r",
        "examples/mlp",
        "params.steps=60",
        "fault_tolerance.checkpoint_every_steps=50",
    )
    run_local(run, world_size=1, timeout_s=150)
    lines = [r for r in timings.read(run) if r.kind == timings.SAVE]
    assert [(r.step, r.reason) for r in lines] == [(50, None), (60, "final")]
    assert lines[1].blocking_s is None and lines[1].time is not None
    assert [s.step for s in _saves(timings.read(run))] == [50]


def test_a_replica_groups_restarts_are_failures_of_the_run() -> None:
    """A group that failed and was restarted alone ended no attempt, but it failed: the
    run's own MTTF counts it (two group restarts in one hour: 30 min)."""
    from ddlaunch.app.advise import mttf
    from ddlaunch.store.attempts import AttemptRecord

    restarts = [{"group": 1, "time": T0 + 600.0}, {"group": 0, "time": T0 + 1800.0}]
    attempt = {"attempt": 0, "start": T0, "end": T0 + 3600.0, "cause": "completed"}
    found = mttf({}, [AttemptRecord.from_json({**attempt, "group_restarts": restarts})], T0)
    assert found is not None and found.value == 1800.0
    assert found.source == (
        "2 failures in 1.00 h of attempts (this run; 2 failures make an uncertain estimate: "
        "--mttf-hours sets one)"
    )
    assert mttf({}, [AttemptRecord.from_json(attempt)], T0) is None


def test_a_rank_replaced_in_process_is_a_failure_of_the_run() -> None:
    """fault_tolerance.restart: in_process: a standby took a crashed rank and the attempt
    went on: that is a failure of the run all the same. One that fell back ended its attempt,
    which counts it (as a crash) once, not twice."""
    from ddlaunch.app.advise import mttf
    from ddlaunch.store.attempts import AttemptRecord

    recovered = {"time": T0 + 600.0, "generation": 1, "ranks": [3], "hosts": ["node2"]}
    fell_back = {**recovered, "time": T0 + 3000.0, "generation": 2, "fell_back": "no standby"}
    first = {"attempt": 0, "start": T0, "end": T0 + 3000.0, "cause": "crash"}
    first |= {"in_process_restarts": [recovered, fell_back]}
    second = {"attempt": 1, "start": T0 + 3000.0, "end": T0 + 6000.0, "cause": "completed"}
    second |= {"in_process_restarts": [{**recovered, "time": T0 + 4000.0}]}
    records = [AttemptRecord.from_json(first), AttemptRecord.from_json(second)]
    found = mttf({}, records, T0)
    assert found is not None and found.value == 2000.0
    assert found.source == "3 failures in 1.67 h of attempts (this run)"


def test_counts_in_the_advice_agree_with_their_nouns() -> None:
    """One restart, one interval, one step: singular; more: plural (``1 restarts`` was
    printed once)."""
    from ddlaunch.app.advise import Advice, Measured, lines, restart_cost
    from ddlaunch.store.attempts import AttemptRecord
    from ddlaunch.store.timings import Timing

    def attempts(failures: int) -> list[AttemptRecord]:
        out = []
        for i in range(failures + 1):
            cause = "crash" if i < failures else "completed"
            start = T0 + 100.0 * i
            out.append(
                AttemptRecord.from_json(
                    {"attempt": i, "job_id": "7", "restart_count": i, "start": start,
                     "end": start + 50.0, "cause": cause}
                )
            )  # fmt: skip
        return out

    def first_steps(runs: list[AttemptRecord]) -> list[Timing]:
        return [
            Timing.from_json({"kind": timings.FIRST_STEP, "time": r.start + 8.0, "attempt": r.key})
            for r in runs
        ]

    one, two = attempts(1), attempts(2)
    assert restart_cost(one, first_steps(one)).source == (
        "failed attempt's end -> next attempt's first step, mean of 1 restart"
    )
    assert restart_cost(two, first_steps(two)).source == (
        "failed attempt's end -> next attempt's first step, mean of 2 restarts"
    )
    advice = Advice(
        save=Measured(0.2, "stall per save, mean of 2 saves"),
        restart=Measured(10.0, "mean of 1 restart"),
        mttf=Measured(7200.0, "fault_tolerance.mttf_hours"),
        step_s=Measured(60.0, "median of 1 interval between saves"),
        current_s=60.0,
        current_steps=1,
    )
    shown = lines("r1", advice)
    assert shown[5].startswith("  now:      every 1 step (1.0 min)")
    assert shown[6].startswith("  advised:  every 1 step (")
