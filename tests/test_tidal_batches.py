"""The step-indexed sampler of a changing data-parallel width (``policy.tidal_batches``): a
hand-worked run, the epoch's order pinned, and random runs of joins, leaves and discarded
steps in which every sample of an epoch is trained exactly once."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import pytest

from ddlaunch.policy.tidal_batches import (
    Cursor,
    EpochOrder,
    FixedGlobal,
    GroupSlice,
    PerGroup,
    Policy,
    StepPlan,
    StepWidth,
    TidalSampler,
    shares,
)


def spans(plan: StepPlan) -> list[tuple[int, int, int]]:
    return [(s.group, s.start, s.stop) for s in plan.slices]


def test_hand_worked_fixed_global_run() -> None:
    """10 samples, a global batch of 4: groups 0, 1, 2 split 4 as 2, 1, 1; a discarded step
    leaves the cursor; group 5 joins; the epoch's last step takes the 2 left; the next
    epoch starts at 0 in a new order."""
    sampler = TidalSampler(dataset_size=10, seed=7, policy=FixedGlobal(batch=4))
    first = sampler.plan(Cursor(), [2, 0, 1])
    assert spans(first) == [(0, 0, 2), (1, 2, 3), (2, 3, 4)]
    assert first.after == Cursor(epoch=0, position=4)
    # Step 1 with groups 0 and 1 is discarded (group 1 failed within it): the cursor stays,
    # and step 1 is trained again by groups 0 and 5.
    discarded = sampler.plan(first.after, [0, 1])
    assert spans(discarded) == [(0, 4, 6), (1, 6, 8)]
    second = sampler.plan(first.after, [5, 0])
    assert spans(second) == [(0, 4, 6), (5, 6, 8)]
    assert second.after == Cursor(epoch=0, position=8)
    last = sampler.plan(second.after, [0, 1, 5])
    assert spans(last) == [(0, 8, 9), (1, 9, 10), (5, 10, 10)]
    assert last.of(5).count == 0
    assert last.after == Cursor(epoch=1, position=0)
    nxt = sampler.plan(last.after, [0])
    assert [(s.epoch, s.start, s.stop) for s in nxt.slices] == [(1, 0, 4)]
    # The samples are the epoch's order at those positions.
    assert sampler.samples(first.of(0)) == EpochOrder(seed=7, epoch=0, size=10).samples([0, 1])
    records = [first.record(0), second.record(1), last.record(2)]
    assert records[1] == StepWidth(step=1, groups=(0, 5), samples=(2, 2))
    assert records[2] == StepWidth(step=2, groups=(0, 1, 5), samples=(1, 1, 0))
    assert sampler.replay(records) == Cursor(epoch=1, position=0)
    assert sampler.replay(records[1:], start=first.after, first_step=1) == last.after


def test_hand_worked_per_group_run() -> None:
    """b = 3 per group over 10 samples: 2 groups take 6; 3 groups would take 9 but only 4
    are left, split 2, 1, 1."""
    sampler = TidalSampler(dataset_size=10, seed=0, policy=PerGroup(batch=3))
    first = sampler.plan(Cursor(), [4, 1])
    assert spans(first) == [(1, 0, 3), (4, 3, 6)]
    last = sampler.plan(first.after, [1, 4, 9])
    assert spans(last) == [(1, 6, 8), (4, 8, 9), (9, 9, 10)]
    assert last.after == Cursor(epoch=1, position=0)


def test_epoch_order_is_pinned() -> None:
    """The order is the same in every process and Python version: these values are the
    construction's (a change of it breaks the resume of every run)."""
    assert EpochOrder(seed=0, epoch=0, size=10).samples(range(10)) == [
        4, 9, 2, 6, 1, 3, 0, 5, 7, 8,
    ]  # fmt: skip
    assert EpochOrder(seed=1, epoch=0, size=10**9).samples(range(3)) == [
        378492259, 970130956, 895581150,
    ]  # fmt: skip
    assert EpochOrder(seed=0, epoch=0, size=1).samples([0]) == [0]


def test_epoch_order_is_a_permutation_that_changes_with_seed_and_epoch() -> None:
    for size in [1, 2, 3, 4, 5, 7, 8, 16, 17, 63, 64, 65, 300]:
        for seed, epoch in [(0, 0), (0, 1), (12345, 3)]:
            order = EpochOrder(seed=seed, epoch=epoch, size=size)
            assert sorted(order.samples(range(size))) == list(range(size)), (size, seed, epoch)
    base = EpochOrder(seed=0, epoch=0, size=300).samples(range(300))
    assert EpochOrder(seed=0, epoch=1, size=300).samples(range(300)) != base
    assert EpochOrder(seed=1, epoch=0, size=300).samples(range(300)) != base
    order = EpochOrder(seed=0, epoch=0, size=300)
    assert [order[p] for p in range(5)] == base[:5]
    assert base != list(range(300))


def test_shares_place_the_remainder_on_the_lowest_ids() -> None:
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(2, 4) == [1, 1, 0, 0]
    assert shares(8, 4) == [2, 2, 2, 2]
    assert shares(0, 3) == [0, 0, 0]


def run_random(
    rng: random.Random, policy: Policy, size: int, steps: int
) -> tuple[TidalSampler, list[StepPlan], list[StepWidth], Cursor]:
    """Random joins, leaves and discarded steps; the committed plans, their records and the
    live cursor."""
    sampler = TidalSampler(dataset_size=size, seed=rng.randrange(1000), policy=policy)
    core = list(range(rng.randint(1, 4)))
    extra: set[int] = set()
    next_extra = 100
    cursor = Cursor()
    committed: list[StepPlan] = []
    records: list[StepWidth] = []
    for _ in range(steps):
        if rng.random() < 0.3:
            extra.add(next_extra)
            next_extra += 1
        if extra and rng.random() < 0.25:
            extra.discard(rng.choice(sorted(extra)))
        live = [*core, *extra]
        rng.shuffle(live)
        plan = sampler.plan(cursor, live)
        assert plan.cursor == cursor
        if rng.random() < 0.2:
            continue  # discarded: a group failed within the step; the cursor stays
        records.append(plan.record(len(records)))
        committed.append(plan)
        cursor = plan.after
    return sampler, committed, records, cursor


@pytest.mark.parametrize("kind", ["fixed_global", "per_group"])
def test_random_runs_train_every_sample_of_an_epoch_once(kind: str) -> None:
    rng = random.Random(2024 if kind == "fixed_global" else 2025)
    for _ in range(150):
        size = rng.randint(1, 60)
        batch = rng.randint(1, 12)
        policy: Policy = (
            FixedGlobal(batch=batch) if kind == "fixed_global" else PerGroup(batch=batch)
        )
        sampler, plans, records, cursor = run_random(rng, policy, size, rng.randint(1, 60))
        trained: dict[int, Counter[int]] = {}
        positions: dict[int, list[tuple[int, int]]] = {}
        for plan in plans:
            width = len(plan.slices)
            if plan.after.epoch == plan.cursor.epoch:  # not the epoch's last step
                assert plan.total == policy.total(width)
            else:
                assert plan.total == size - plan.cursor.position <= policy.total(width)
            counts = [s.count for s in plan.slices]
            assert max(counts) - min(counts) <= 1
            assert counts == sorted(counts, reverse=True)
            for piece in plan.slices:
                assert piece.epoch == plan.cursor.epoch
                positions.setdefault(piece.epoch, []).append((piece.start, piece.stop))
                trained.setdefault(piece.epoch, Counter()).update(sampler.samples(piece))
        for epoch, seen in trained.items():
            assert max(seen.values()) == 1, (epoch, seen)  # no sample twice in an epoch
            spans_ = sorted(p for p in positions[epoch] if p[0] < p[1])
            assert all(a[1] == b[0] for a, b in pairwise(spans_))
            if epoch < cursor.epoch:  # a completed epoch: every sample once
                assert sorted(seen) == list(range(size))
            else:
                assert sum(seen.values()) == cursor.position
        assert sampler.replay(records) == cursor
        cut = rng.randint(0, len(plans))
        saved = plans[cut - 1].after if cut else Cursor()
        assert sampler.replay(records[cut:], start=saved, first_step=cut) == cursor


def test_random_runs_are_deterministic() -> None:
    for policy in (FixedGlobal(batch=5), PerGroup(batch=2)):
        first = run_random(random.Random(9), policy, 37, 80)
        again = run_random(random.Random(9), policy, 37, 80)
        assert first[1] == again[1] and first[3] == again[3]
        samples = [first[0].samples(s) for p in first[1] for s in p.slices]
        assert samples == [again[0].samples(s) for p in again[1] for s in p.slices]


def test_a_discarded_step_is_trained_by_the_next_committed_one() -> None:
    sampler = TidalSampler(dataset_size=100, seed=3, policy=FixedGlobal(batch=8))
    at = Cursor(epoch=2, position=40)
    discarded = sampler.plan(at, [0, 1, 2, 3])
    redone = sampler.plan(at, [0, 2])
    lost = {x for s in discarded.slices for x in sampler.samples(s)}
    assert lost == {x for s in redone.slices for x in sampler.samples(s)}
    assert len(lost) == 8


def test_per_group_global_batch_is_b_times_width() -> None:
    sampler = TidalSampler(dataset_size=10_000, seed=1, policy=PerGroup(batch=16))
    for width in range(1, 40):
        plan = sampler.plan(Cursor(), range(width))
        assert plan.total == 16 * width
        assert {s.count for s in plan.slices} == {16}


def test_a_batch_larger_than_the_data_set_trains_one_epoch_per_step() -> None:
    sampler = TidalSampler(dataset_size=5, seed=1, policy=FixedGlobal(batch=64))
    plan = sampler.plan(Cursor(), [0, 1])
    assert spans(plan) == [(0, 0, 3), (1, 3, 5)]
    assert plan.after == Cursor(epoch=1, position=0)


def test_errors() -> None:
    sampler = TidalSampler(dataset_size=10, seed=0, policy=FixedGlobal(batch=4))
    with pytest.raises(ValueError) as e:
        sampler.plan(Cursor(), [])
    assert str(e.value) == "a step needs at least one live replica group, got none"
    with pytest.raises(ValueError) as e:
        sampler.plan(Cursor(), [3, 1, 3])
    assert str(e.value) == "replica groups listed twice: 3"
    with pytest.raises(ValueError) as e:
        sampler.plan(Cursor(), [-1, 0])
    assert str(e.value) == "a replica group's id cannot be negative, got -1"
    with pytest.raises(ValueError) as e:
        TidalSampler(dataset_size=0, seed=0, policy=PerGroup(batch=1))
    assert str(e.value) == "the data set must hold at least 1 sample, got 0"
    with pytest.raises(ValueError) as e:
        FixedGlobal(batch=0)
    assert str(e.value) == "the fixed global batch must be at least 1, got 0"
    with pytest.raises(ValueError) as e:
        PerGroup(batch=-2)
    assert str(e.value) == "the per-group batch must be at least 1, got -2"
    with pytest.raises(ValueError) as e:
        sampler.plan(Cursor(epoch=0, position=10), [0])
    assert str(e.value) == "the cursor's position 10 is past the data set's 10 samples"
    with pytest.raises(ValueError) as e:
        Cursor(epoch=-1)
    assert str(e.value) == "a cursor cannot be negative, got epoch -1 position 0"
    with pytest.raises(KeyError):
        sampler.plan(Cursor(), [0]).of(1)
    with pytest.raises(IndexError) as e:
        EpochOrder(seed=0, epoch=0, size=3)[3]
    assert str(e.value) == "position 3 is outside the epoch's 0..2"


def test_fewer_samples_than_groups_gives_zero_shares_not_an_error() -> None:
    sampler = TidalSampler(dataset_size=100, seed=0, policy=FixedGlobal(batch=2))
    plan = sampler.plan(Cursor(), [0, 1, 2, 3])
    assert [s.count for s in plan.slices] == [1, 1, 0, 0]
    assert plan.slices[2] == GroupSlice(group=2, epoch=0, start=2, stop=2)
    assert sampler.samples(plan.slices[2]) == []


def test_replay_refuses_records_that_do_not_fit() -> None:
    sampler = TidalSampler(dataset_size=10, seed=0, policy=FixedGlobal(batch=4))
    four = StepWidth(step=0, groups=(0, 1), samples=(2, 2))
    with pytest.raises(ValueError) as e:
        sampler.replay([four, StepWidth(step=2, groups=(0,), samples=(4,))])
    assert str(e.value) == "the committed steps are not consecutive: step 1 expected, got step 2"
    with pytest.raises(ValueError) as e:
        sampler.replay([four, StepWidth(step=1, groups=(0,), samples=(7,))])
    assert str(e.value) == "step 1 trained 7 samples but only 6 were left in epoch 0"
    with pytest.raises(ValueError) as e:
        StepWidth(step=3, groups=(0, 1), samples=(1,))
    assert str(e.value) == "step 3: 2 groups but 1 sample count"
    with pytest.raises(ValueError) as e:
        StepWidth(step=3, groups=(0,), samples=(-1,))
    assert str(e.value) == "step 3: a group's sample count cannot be negative"
