"""The pure checkpoint policy: when to save, what keep-last-K deletes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlaunch.checkpoint.policy import should_checkpoint, to_delete

MIN = 60.0

# ---------------------------------------------------------------- to_delete


def test_keep_last_two_of_four() -> None:
    assert to_delete([1, 2, 3, 4], keep_last=2) == [1, 2]


def test_input_order_and_duplicates_do_not_matter() -> None:
    assert to_delete([40, 10, 30, 10, 20], keep_last=3) == [10]


@pytest.mark.parametrize("keep_last", [0, -1, -100])
def test_non_positive_k_keeps_everything(keep_last: int) -> None:
    assert to_delete([1, 2, 3], keep_last=keep_last) == []


def test_fewer_checkpoints_than_k_deletes_nothing() -> None:
    assert to_delete([5], keep_last=3) == []
    assert to_delete([], keep_last=1) == []


@settings(max_examples=50, deadline=None)  # the machine is small and shared
@given(st.lists(st.integers(min_value=0, max_value=10**9)), st.integers(-3, 20))
def test_to_delete_properties(steps: list[int], keep_last: int) -> None:
    doomed = to_delete(steps, keep_last)
    unique = set(steps)
    kept = unique - set(doomed)
    assert set(doomed) <= unique
    assert doomed == sorted(set(doomed))
    if keep_last <= 0:
        assert doomed == []
    else:
        assert len(kept) == min(keep_last, len(unique))
        if unique:
            assert max(unique) in kept  # the newest is never deleted
        # Everything kept is newer than everything deleted.
        assert not doomed or min(kept) > max(doomed)


# ---------------------------------------------------------------- should_checkpoint


def due(
    step: int,
    *,
    now: float = 1000.0,
    last_step: int | None = None,
    last_time: float | None = 1000.0,
    every_steps: int | None = None,
    every_minutes: float | None = None,
) -> bool:
    return should_checkpoint(step, now, last_step, last_time, every_steps, every_minutes)


def test_step_trigger_fires_on_multiples() -> None:
    fired = [s for s in range(0, 31) if due(s, every_steps=10)]
    assert fired == [10, 20, 30]  # never step 0: there is nothing to save yet


def test_step_trigger_stays_aligned_after_a_resume() -> None:
    # Resumed from step 950 with every_steps=100: the next save is 1000, not 1050.
    assert not due(990, last_step=950, every_steps=100)
    assert due(1000, last_step=950, every_steps=100)


def test_never_saves_a_step_twice_or_backwards() -> None:
    assert not due(20, last_step=20, every_steps=10)
    assert not due(10, last_step=20, every_steps=10, every_minutes=1, now=10**6)


def test_time_trigger() -> None:
    assert not due(7, now=1000 + 29.9 * MIN, last_time=1000, every_minutes=30)
    assert due(7, now=1000 + 30 * MIN, last_time=1000, every_minutes=30)


def test_time_trigger_needs_a_start_time() -> None:
    assert not due(7, now=10**9, last_time=None, every_minutes=1)


@pytest.mark.parametrize("disabled", [None, 0])
def test_zero_or_none_disables_a_trigger(disabled: int | None) -> None:
    assert not due(100, now=10**9, every_steps=disabled, every_minutes=disabled)


def test_either_trigger_suffices() -> None:
    assert due(7, now=1000 + 31 * MIN, every_steps=10, every_minutes=30)
    assert due(10, now=1000.0, every_steps=10, every_minutes=30)


@pytest.mark.parametrize(
    ("every_steps", "every_minutes", "message"),
    [(-1, None, "every_steps must be >= 0"), (None, -0.5, "every_minutes must be >= 0")],
)
def test_negative_intervals_are_rejected(
    every_steps: int | None, every_minutes: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        due(1, every_steps=every_steps, every_minutes=every_minutes)
