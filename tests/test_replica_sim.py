"""The replica-group goodput simulator (``policy.replica_sim``): its limits (one group is
``interval``'s whole-job model, no failures cost nothing but the saves, more groups never
lose without a stall, groups that stay down degrade it to whole-job restarts) and its
closed form against the simulation."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from ddlaunch.policy import interval
from ddlaunch.policy.replica_sim import Run, Scenario, expected, gpu_mttf, simulate, simulated

KOKOLIS_16K = 1.8 * 3600  # job MTTF at 16,384 GPUs (Kokolis et al. 2024)


def scenario(**changes: object) -> Scenario:
    """16,384 GPUs in 16 groups at the published MTTF, Meta's large-scale costs."""
    base: dict[str, object] = dict(
        gpus=16384,
        gpus_per_node=8,
        groups=16,
        gpu_mttf_s=gpu_mttf(KOKOLIS_16K, 16384),
        interval_s=interval.young_daly(2.0, KOKOLIS_16K),
        save_s=2.0,
        job_restart_s=600.0,
        group_restart_s=180.0,
        stall_s=5.0,
        step_s=5.0,
        lost_steps=1.0,
    )
    return Scenario(**{**base, **changes})  # type: ignore[arg-type]


def accounted(run: Run) -> float:
    return (
        run.work_s
        + run.saves_s
        + run.stalls_s
        + run.redone_s
        + run.degraded_s
        + run.restarts_s
        + run.lost_s
    )


def test_one_group_is_the_whole_job_model() -> None:
    """One group, or every failure below min_groups: ``interval.simulate`` on the same failure
    times, run for run (failures, restarts, saves, the work lost), and its closed form."""
    rng = random.Random(11)
    for case in range(120):
        mttf = rng.choice([200.0, 600.0, 6480.0])
        every, save = rng.uniform(1.0, 150.0), rng.choice([0.0, 0.018, 5.0, 30.0])
        work, restart = rng.uniform(100.0, 20_000.0), rng.choice([0.0, 13.0, 300.0])
        groups = rng.choice([1, 2, 4, 8])
        s = Scenario(
            gpus=64,
            gpus_per_node=8,
            groups=groups,
            min_groups=groups,
            gpu_mttf_s=gpu_mttf(mttf, 64),
            interval_s=every,
            save_s=save,
            job_restart_s=restart,
            group_restart_s=rng.uniform(0.0, 100.0),  # never used: no group restarts alone
            stall_s=rng.uniform(0.0, 10.0),
            step_s=1.0,
            lost_steps=1.0,
        )
        ours = simulate(s, work, case)
        theirs = interval.simulate(
            work, every, save, restart, interval.exponential_failures(mttf, case)
        )
        assert (ours.job_failures, ours.failures) == (theirs.failures, 0), case
        assert ours.work_s == pytest.approx(work, rel=1e-12)
        for field in ("wall_s", "saves_s", "restarts_s", "lost_s"):
            assert getattr(ours, field) == pytest.approx(getattr(theirs, field), rel=1e-9), case
        assert ours.stalls_s == ours.redone_s == ours.degraded_s == 0.0
        assert expected(s).goodput == pytest.approx(
            interval.expected_ettr(every, save, restart, mttf), rel=1e-12
        )


def test_no_failures_cost_only_the_saves() -> None:
    never = scenario(gpu_mttf_s=math.inf, save_s=0.0, interval_s=100.0)
    run = simulate(never, 10_000.0, 0)
    assert (run.goodput, run.wall_s, run.failures, run.job_failures) == (1.0, 10_000.0, 0, 0)
    assert expected(never).goodput == 1.0
    saving = scenario(gpu_mttf_s=math.inf, save_s=5.0, interval_s=100.0)
    run = simulate(saving, 10_000.0, 0)
    assert (run.wall_s, run.saves_s) == (10_500.0, 500.0)
    assert run.goodput == expected(saving).goodput == 100.0 / 105.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_second_is_accounted_and_a_seed_repeats(seed: int) -> None:
    s = scenario(groups=8, min_groups=7, gpu_mttf_s=gpu_mttf(600.0, 16384))
    run = simulate(s, 100 * 600.0, seed)
    assert run.failures > 50 and run.job_failures > 0  # both rungs were taken
    assert run.wall_s == pytest.approx(accounted(run), rel=1e-9)
    assert run == simulate(s, 100 * 600.0, seed)
    assert run != simulate(s, 100 * 600.0, seed + 10)


def test_more_groups_never_lose_without_a_stall() -> None:
    """With no stall nor steps redone and a group restart no dearer than the job's, each
    doubling of the groups raises the goodput (a failure costs a smaller share), in the
    simulation (the same failure times) and the closed form. With a stall as long as a
    group's restart a failure costs the stall whatever the groups: nothing is gained."""
    free = [scenario(groups=g, stall_s=0.0, lost_steps=0.0) for g in (1, 2, 4, 8, 16, 32, 64)]
    sim = [simulated(s, seeds=5).goodput for s in free]
    closed = [expected(s).goodput for s in free]
    assert all(b > a for a, b in itertools.pairwise(sim)), sim
    assert all(b > a for a, b in itertools.pairwise(closed)), closed
    stalled = [scenario(groups=g, stall_s=180.0, lost_steps=0.0) for g in (16, 64)]
    sim16, sim64 = (simulated(s, seeds=5).goodput for s in stalled)
    assert sim64 == pytest.approx(sim16, abs=2e-5)
    assert sim16 < sim[4] - 0.02  # (the stall does cost: 16 groups without it)


def test_groups_that_stay_down_degrade_to_whole_job_restarts() -> None:
    """4 groups, min 2: as a group's restart outgrows the time between its failures, the
    groups fall below min_groups: from no whole-job failure at all to every third failure
    one (4 -> 3 -> 2 groups, then the job), and the goodput falls below the whole-job
    model's (the lost throughput of the groups down on top of its restarts)."""
    runs = [
        simulated(
            scenario(groups=4, min_groups=2, stall_s=0.0, lost_steps=0.0, group_restart_s=r),
            seeds=5,
        )
        for r in (60.0, 3600.0, 36_000.0, 1e7)
    ]
    shares = [r.job_failures / (r.failures + r.job_failures) for r in runs]
    assert shares[0] == 0.0
    assert all(b > a for a, b in itertools.pairwise(shares)), shares
    assert shares[-1] == pytest.approx(1 / 3, abs=0.01)
    goodputs = [r.goodput for r in runs]
    assert all(b < a for a, b in itertools.pairwise(goodputs)), goodputs
    whole = interval.expected_ettr(interval.young_daly(2.0, KOKOLIS_16K), 2.0, 600.0, KOKOLIS_16K)
    assert goodputs[0] > whole > goodputs[-1]


# Closed form vs 20 seeds of 100 MTTFs. Tolerances in goodput, from the spread of the
# simulated goodput about the closed form over 6 disjoint sets of 20 seeds (in brackets,
# percentage points): 0.005 points where it spread 0.0005 (what the stall alone costs there:
# 0.015), 0.05 where it spread 0.015 (the stall: 0.07), 0.25 at 0.1, 1.0 at 0.4 (a whole-job
# restart every 30 minutes: interval's own noise).
@pytest.mark.parametrize(
    ("changes", "tolerance"),
    [
        # This machine's measured costs at 16,384 GPUs, 16 groups.
        (
            dict(job_restart_s=12.0, group_restart_s=4.5, stall_s=1.0, step_s=0.19),
            0.00005,
        ),
        (dict(groups=8), 0.0005),  # Meta's large-scale costs, 8 groups
        # Stress: 1,024 GPUs failing every 30 minutes, long stalls, whole-job failures rare.
        (
            dict(
                gpus=1024,
                groups=8,
                min_groups=4,
                gpu_mttf_s=gpu_mttf(1800.0, 1024),
                interval_s=300.0,
                save_s=10.0,
                job_restart_s=300.0,
                group_restart_s=900.0,
                stall_s=30.0,
                step_s=10.0,
                lost_steps=2.0,
            ),
            0.0025,
        ),
        # No spare: a group waits for its node's repair (20 min) before its restart.
        (
            dict(
                gpus=1024,
                groups=8,
                min_groups=2,
                gpu_mttf_s=gpu_mttf(3600.0, 1024),
                interval_s=300.0,
                save_s=10.0,
                job_restart_s=300.0,
                group_restart_s=300.0,
                spare_nodes=0,
                repair_s=1200.0,
            ),
            0.0025,
        ),
        # Every failure a whole-job one (min_groups == groups): interval's model.
        (
            dict(
                gpus=1024,
                groups=4,
                min_groups=4,
                gpu_mttf_s=gpu_mttf(1800.0, 1024),
                interval_s=300.0,
                save_s=10.0,
                job_restart_s=300.0,
            ),
            0.01,
        ),
    ],
)
def test_closed_form_agrees_with_the_simulation(
    changes: dict[str, object], tolerance: float
) -> None:
    s = scenario(**changes)
    run, closed = simulated(s, seeds=20), expected(s)
    assert run.goodput == pytest.approx(closed.goodput, abs=tolerance)
    for name, seconds in (
        ("saves", run.saves_s),
        ("stalls", run.stalls_s),
        ("redone", run.redone_s),
        ("degraded", run.degraded_s),
        ("restarts", run.restarts_s),
        ("lost", run.lost_s),
    ):
        assert run.share(seconds) == pytest.approx(getattr(closed, name), abs=tolerance), name
    assert closed.goodput + sum(
        getattr(closed, n) for n in ("saves", "stalls", "redone", "degraded", "restarts", "lost")
    ) == pytest.approx(1.0, rel=1e-12)


def test_spares_a_pool_that_never_runs_dry_or_none() -> None:
    """A pool of spares between the two ends: none is a group restart lengthened by the
    repair, run for run; a pool that never runs dry is no pool at all; one spare is in
    between (and has no closed form)."""
    base = dict(groups=8, min_groups=2, gpu_mttf_s=gpu_mttf(600.0, 16384))
    none = simulated(scenario(**base, spare_nodes=0, repair_s=1200.0), seeds=3)
    longer = simulated(scenario(**base, group_restart_s=180.0 + 1200.0), seeds=3)
    assert (none.failures, none.job_failures) == (longer.failures, longer.job_failures)
    assert none.goodput == pytest.approx(longer.goodput, rel=1e-9)
    plenty = simulated(scenario(**base, spare_nodes=1000, repair_s=1200.0), seeds=3)
    unlimited = simulated(scenario(**base), seeds=3)
    assert (plenty.failures, plenty.job_failures) == (unlimited.failures, unlimited.job_failures)
    assert plenty.goodput == pytest.approx(unlimited.goodput, rel=1e-9)
    one = simulated(scenario(**base, spare_nodes=1, repair_s=1200.0), seeds=3)
    assert none.goodput < one.goodput < plenty.goodput
    with pytest.raises(ValueError, match="no closed form with a pool of spares"):
        expected(scenario(**base, spare_nodes=1, repair_s=1200.0))


def test_scenario_refuses_groups_of_part_nodes_and_impossible_minimums() -> None:
    with pytest.raises(ValueError, match="do not split into 3 groups of whole 8-GPU nodes"):
        scenario(groups=3)
    with pytest.raises(ValueError, match=r"min_groups must be 1\.\.16, got 17"):
        scenario(min_groups=17)
    with pytest.raises(ValueError, match="stall and steps redone outlast the job's MTTF"):
        scenario(stall_s=KOKOLIS_16K - 5.0)
    s = scenario(groups=64)
    assert (s.nodes, s.job_mttf_s, s.group_mttf_s) == (2048, KOKOLIS_16K, 64 * KOKOLIS_16K)
