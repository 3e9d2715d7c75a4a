"""Counts and their words in the right number (``ddlaunch.wording``), and the messages that
put a count before a noun or a verb: one thing is singular, none and several are plural."""

from __future__ import annotations

import pytest

from ddlaunch.wording import counted, plural


@pytest.mark.parametrize(
    ("count", "expected"),
    [(0, "0 restarts"), (1, "1 restart"), (2, "2 restarts"), (-1, "-1 restarts")],
)
def test_a_count_takes_the_singular_for_exactly_one(count: int, expected: str) -> None:
    assert counted(count, "restart") == expected


def test_irregular_plurals_and_verbs_are_given() -> None:
    assert [counted(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]
    assert [plural(n, "is", "are") for n in (0, 1, 2)] == ["are", "is", "are"]
    assert [plural(n, "it", "them") for n in (1, 2)] == ["it", "them"]


def test_a_fraction_is_plural() -> None:
    assert [plural(x, "step") for x in (1.0, 1.5, 0.5)] == ["step", "steps", "steps"]


def test_the_requeue_policy_counts_a_single_restart_and_requeue_in_the_singular() -> None:
    """The reason ``status`` and ``report`` show for a run that used up its retries."""
    from ddlaunch.policy.requeue import Ending, History, RetryBudget, decide

    def stopped(restarts: int, requeues: int) -> str:
        budget = RetryBudget(max_requeues=requeues, max_restarts=restarts, replaceable=True)
        ending = Ending(cause="crash", blamed=(), committed_step=10)
        decision = decide(ending, budget, History(requeues=requeues, restarts=restarts))
        assert not decision.retry
        return decision.reason

    assert stopped(1, 1) == (
        "stopped: 1 restart in the allocation reached fault_tolerance.max_restarts=1, "
        "1 requeue reached fault_tolerance.max_requeues=1"
    )
    assert stopped(2, 3) == (
        "stopped: 2 restarts in the allocation reached fault_tolerance.max_restarts=2, "
        "3 requeues reached fault_tolerance.max_requeues=3"
    )


@pytest.mark.parametrize(
    ("failed", "outcomes", "expected"),
    [
        (1, 3, "1 of 3 arrays was not submitted (2 members); the others were."),
        (2, 3, "2 of 3 arrays were not submitted (4 members); the other was."),
        (1, 1, "the array was not submitted (2 members)."),
        (2, 2, "none of the 2 arrays was submitted (4 members)."),
    ],
)
def test_a_sweep_s_failed_arrays_are_counted_in_the_right_number(
    failed: int, outcomes: int, expected: str
) -> None:
    from ddlaunch.cli.sweep import _report
    from ddlaunch.errors import UserError
    from ddlaunch.sweeps.submit import ArrayOutcome

    arrays = [
        ArrayOutcome(f"a{i}", (2 * i, 2 * i + 1), None if i < failed else str(100 + i), "boom")
        for i in range(outcomes)
    ]
    with pytest.raises(UserError) as info:
        _report(arrays, "/runs/sw")
    assert str(info.value) == (
        f"{expected} Retry those with: ddlaunch sweep resubmit /runs/sw --failed"
    )
