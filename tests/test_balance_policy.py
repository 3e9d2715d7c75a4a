"""The shares of the global batch (``ddlaunch.policy.balance``): proportional, whole, summing
to the global batch, at least one per rank, equal within a component up to the remainder."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from ddlaunch.policy.balance import (
    ALL,
    Component,
    ComponentShare,
    Shares,
    by_throughput,
    component_index,
    describe,
    equal,
    format_components,
    parse_components,
    plain_share,
    rate_text,
)

FAST_SLOW = (Component("fast", 4), Component("slow", 4))


def test_parse_and_format_round_trip() -> None:
    parsed = parse_components("fast:4,slow:4", 8)
    assert parsed == FAST_SLOW
    assert format_components(parsed) == "fast:4,slow:4"
    assert parse_components(None, 6) == (Component(ALL, 6),)
    assert parse_components(" ", 6) == (Component(ALL, 6),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "fast:4,slow",
            "DDLAUNCH_TRAIN_COMPONENTS='fast:4,slow': 'slow' is not name:ranks "
            "(e.g. fast:4,slow:4)",
        ),
        (
            "fast:0,slow:8",
            "DDLAUNCH_TRAIN_COMPONENTS='fast:0,slow:8': 'fast:0' is not name:ranks (e.g. "
            "fast:4,slow:4)",
        ),
        ("a:4,a:4", "DDLAUNCH_TRAIN_COMPONENTS='a:4,a:4': 'a' is listed twice"),
        (
            "fast:4,slow:2",
            "DDLAUNCH_TRAIN_COMPONENTS='fast:4,slow:2' counts 6 ranks, the world has 8",
        ),
    ],
)
def test_parse_errors_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_components(text, 8)
    assert str(info.value) == message


def test_component_index() -> None:
    assert [component_index(FAST_SLOW, r) for r in range(8)] == [0] * 4 + [1] * 4
    with pytest.raises(ValueError):
        component_index(FAST_SLOW, 8)


def test_two_to_one_exact() -> None:
    shares = by_throughput(FAST_SLOW, [2.0, 1.0], 96)
    assert shares.per_rank() == (16,) * 4 + (8,) * 4
    assert describe(shares, [2100.0, 1300.0]) == (
        "fast 16/rank x4, slow 8/rank x4 (by throughput: 2.1 vs 1.3 k samples/s)"
    )
    assert rate_text([196.2, 99.4]) == "196 vs 99 samples/s"
    assert rate_text([2.5e6, 1.25e6]) == "2.5 vs 1.2 M samples/s"


def test_remainder_goes_to_the_largest_fraction_then_the_lower_rank() -> None:
    # Ideal 16.67 and 8.33 per rank: floors give 96, the 4 left go to the fast ranks (.67).
    assert by_throughput(FAST_SLOW, [2.0, 1.0], 100).per_rank() == (17,) * 4 + (8,) * 4
    # Equal rates, 10 over 4+4 ranks: 1 each, the 2 left to ranks 0 and 1.
    shares = by_throughput(FAST_SLOW, [1.0, 1.0], 10)
    assert shares.per_rank() == (2, 2, 1, 1, 1, 1, 1, 1)
    assert shares.components[0] == ComponentShare("fast", 4, 1, 2)
    assert describe(shares) == "fast 2/rank x2 + 1/rank x2, slow 1/rank x4"


def test_every_rank_gets_one_sample_however_slow() -> None:
    shares = by_throughput(FAST_SLOW, [1000.0, 1.0], 40)
    assert shares.per_rank() == (9,) * 4 + (1,) * 4


def test_a_batch_below_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot give each of 8 ranks a sample"):
        by_throughput(FAST_SLOW, [1.0, 1.0], 7)
    with pytest.raises(ValueError, match=r"rate 0\.0 is not a positive number"):
        by_throughput(FAST_SLOW, [1.0, 0.0], 8)


def test_equal_and_plain() -> None:
    assert equal(FAST_SLOW, 64).per_rank() == (8,) * 8
    assert plain_share(65, 8) == 8


COMPONENT_SETS = [
    (Component("a", 1),),
    (Component("a", 3), Component("b", 5)),
    (Component("a", 2), Component("b", 1), Component("c", 4)),
    (Component("a", 8), Component("b", 8)),
]
RATES = [0.3, 1.0, 1.7, 2.0, 7.5, 1000.0]


@pytest.mark.parametrize("components", COMPONENT_SETS, ids=lambda cs: format_components(cs))
def test_properties_over_the_combinations(components: tuple[Component, ...]) -> None:
    """For every rate assignment and global batch from the world size up: whole shares that
    sum exactly, at least one per rank, a component's ranks within one sample (the lower
    ranks holding the extra), and each rank within one sample of its proportional ideal
    when no component's ideal is below one sample."""
    world = sum(c.ranks for c in components)
    for rates in itertools.product(RATES, repeat=len(components)):
        for global_batch in (world, world + 1, 2 * world + 3, 97, 1000):
            if global_batch < world:
                continue
            shares = by_throughput(components, rates, global_batch)
            per_rank = shares.per_rank()
            assert sum(per_rank) == global_batch == shares.total
            assert len(per_rank) == world and min(per_rank) >= 1
            weight = sum(c.ranks * Fraction(r) for c, r in zip(components, rates, strict=True))
            ideals = [global_batch * Fraction(r) / weight for r in rates]
            lifted = min(ideals) < 1  # then the others split what is left
            first = 0
            for c, ideal in zip(components, ideals, strict=True):
                own = per_rank[first : first + c.ranks]
                first += c.ranks
                assert max(own) - min(own) <= 1
                assert list(own) == sorted(own, reverse=True)
                if not lifted:
                    assert all(abs(s - ideal) < 1 for s in own), (rates, global_batch)
            # Faster components never get fewer samples per rank.
            order = sorted(range(len(components)), key=lambda i: rates[i])
            bases = [shares.components[i].share for i in order]
            assert bases == sorted(bases)


def test_same_components() -> None:
    shares = Shares((ComponentShare("fast", 4, 16), ComponentShare("slow", 4, 8)))
    assert shares.same_components(FAST_SLOW)
    assert not shares.same_components((Component("fast", 4), Component("slow", 3)))
