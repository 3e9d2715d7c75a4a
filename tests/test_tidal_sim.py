"""The tidal-width simulation (``policy.tidal_sim``): no idle capacity is the fixed width to
the second, a hand-worked run, more holes never slow the per-group policy when joins and
leaves block nothing, the holes' mean, and its errors."""

from __future__ import annotations

import dataclasses

import pytest

from ddlaunch.policy.tidal_batches import FixedGlobal, PerGroup
from ddlaunch.policy.tidal_sim import (
    Hole,
    Scenario,
    fixed_time,
    holes,
    run,
    simulate,
    simulated,
)


def scenario(**changes: object) -> Scenario:
    base: dict[str, object] = dict(
        groups=16,
        group_gpus=64,
        policy=PerGroup(batch=32),
        cluster_gpus=1024,
        idle_fraction=0.1,
    )
    return Scenario(**{**base, **changes})  # type: ignore[arg-type]


def day(s: Scenario) -> float:
    """The samples of a day at the fixed width."""
    return s.rate(s.groups) * 86_400.0


@pytest.mark.parametrize("policy", [PerGroup(batch=32), FixedGlobal(batch=512)])
def test_no_idle_capacity_is_the_fixed_width(policy: PerGroup | FixedGlobal) -> None:
    for changes in ({"idle_fraction": 0.0}, {"cluster_gpus": 0}):
        s = scenario(policy=policy, **changes)
        for seed in range(3):
            result = simulate(s, day(s), seed)
            assert result.wall_s == result.fixed_s == pytest.approx(86_400.0)
            assert result.joins == result.leaves == 0
            assert result.speedup == 1.0
    # Holes that no group may take: the same, but summed over the holes' events.
    s = scenario(policy=policy, max_extra=0)
    result = simulate(s, day(s), 0)
    assert result.wall_s == pytest.approx(result.fixed_s, rel=1e-12)
    assert result.joins == result.lost_joins == result.extra_s == 0


def test_a_hand_worked_run() -> None:
    """2 groups of 10 samples a 1 s step (20/s; 30/s with a third). A hole from 10 s to
    40 s: its group joins at 15 s after a 5 s start-up; the others block 1 s; it leaves at
    40 s and they block 2 s. A hole from 50 s to 53 s ends before its group joins: no cost.
    0-15: 300 samples; 16-40: 720; 42 on: 980 more at 20/s, done at 91 s."""
    s = Scenario(
        groups=2,
        group_gpus=8,
        policy=PerGroup(batch=10),
        cluster_gpus=8,
        idle_fraction=0.5,
        step_s=1.0,
        join_s=5.0,
        join_stall_s=1.0,
        leave_s=2.0,
    )
    result = run(s, 2000.0, [Hole(start=10.0, end=40.0), Hole(start=50.0, end=53.0)])
    assert result.wall_s == pytest.approx(91.0)
    assert result.fixed_s == 100.0
    assert (result.joins, result.leaves, result.lost_joins) == (1, 1, 1)
    assert result.blocked_s == pytest.approx(3.0)
    assert result.extra_s == pytest.approx(25.0)
    assert result.joining_s == pytest.approx(8.0)


def test_fixed_global_rate() -> None:
    """A global batch of 10 over 2 groups (5 each, 1 s a step, half of it fixed): 3 groups'
    largest share is 4 (a step of 0.5 + 0.5 x 4/5 = 0.9 s), 5 groups' is 2 (0.7 s), 10 and
    more groups' is 1 (0.6 s)."""
    s = scenario(groups=2, policy=FixedGlobal(batch=10), step_s=1.0, fixed_share=0.5)
    assert [s.rate(w) for w in (2, 3, 5, 10, 40)] == pytest.approx(
        [10.0, 10 / 0.9, 10 / 0.7, 10 / 0.6, 10 / 0.6]
    )
    assert scenario(policy=PerGroup(batch=32), step_s=2.0).rate(20) == 320.0


def test_more_idle_capacity_never_slows_the_per_group_policy_without_blocks() -> None:
    for join_s in (0.0, 180.0):
        for seed in range(4):
            walls = []
            for fraction in (0.0, 0.02, 0.1, 0.3, 1.0):
                s = scenario(idle_fraction=fraction, join_s=join_s, join_stall_s=0, leave_s=0)
                walls.append(simulate(s, day(s) / 4, seed).wall_s)
            assert walls == sorted(walls, reverse=True), (join_s, seed, walls)
            assert walls[-1] < walls[0]


def test_the_holes_thin_one_stream() -> None:
    """At a lower fraction the holes are a subset of those at a higher one (same seed)."""
    low = scenario(idle_fraction=0.1)
    high = dataclasses.replace(low, idle_fraction=0.4)
    few = [h for h, _ in zip(holes(low, 5), range(60), strict=False)]
    many = set()
    for hole in holes(high, 5):
        many.add(hole)
        if hole.start > few[-1].start:
            break
    assert set(few) <= many
    assert len(many) > 2 * len(few)


def test_the_mean_extra_groups_are_the_idle_share() -> None:
    """With no start-up, the joined groups are the holes: on average idle_fraction of the
    cluster's groups (16 x 0.25 = 4), within the noise of a few days."""
    s = scenario(idle_fraction=0.25, join_s=0.0, join_stall_s=0.0, leave_s=0.0)
    results = simulated(s, day(s) * 3, seeds=4)
    mean = sum(r.extra_s for r in results) / sum(r.wall_s for r in results)
    assert mean == pytest.approx(4.0, rel=0.1)


def test_costs_slow_it_down_and_runs_are_deterministic() -> None:
    free = scenario(join_s=0.0, join_stall_s=0.0, leave_s=0.0)
    costly = scenario()
    assert simulate(costly, day(costly), 1) == simulate(costly, day(costly), 1)
    assert simulate(costly, day(costly), 1) != simulate(costly, day(costly), 2)
    assert simulate(free, day(free), 1).wall_s < simulate(costly, day(costly), 1).wall_s
    capped = dataclasses.replace(costly, max_extra=1)
    result = simulate(capped, day(capped), 1)
    assert result.extra_s <= result.wall_s
    assert result.extra_s + result.joining_s <= result.wall_s * (1 + 1e-12)


def test_errors() -> None:
    with pytest.raises(ValueError) as e:
        scenario(idle_fraction=1.5)
    assert str(e.value) == "idle_fraction must be 0..1, got 1.5"
    with pytest.raises(ValueError) as e:
        scenario(fixed_share=-0.1)
    assert str(e.value) == "fixed_share must be 0..1, got -0.1"
    with pytest.raises(ValueError) as e:
        scenario(leave_s=-1.0)
    assert str(e.value) == "the join and leave costs cannot be negative"
    with pytest.raises(ValueError) as e:
        scenario(groups=0)
    assert str(e.value) == "groups and group_gpus must be at least 1"
    with pytest.raises(ValueError) as e:
        run(scenario(), 0.0, [])
    assert str(e.value) == "samples must be positive, got 0.0"
    assert fixed_time(scenario(step_s=2.0), 1024.0) == 4.0  # 16 x 32 samples a 2 s step
