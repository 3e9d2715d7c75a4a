"""The one requeue policy (pure): progress guard, cap, health findings with and without a node
to blame, and the final state of an attempt that is not requeued."""

from __future__ import annotations

import pytest

from ddlaunch.policy.requeue import (
    REPLACE_CAUSES,
    RESTART_CAUSES,
    Ending,
    History,
    RetryBudget,
    decide,
    final_state,
    restartable,
)


@pytest.mark.parametrize(
    ("cause", "now", "resumed", "so_far", "cap", "requeue", "reason"),
    [
        ("completed", 300, 0, 0, 3, False, "completed"),
        ("cancelled", 40, 20, 0, 3, False, "cancelled by the user"),
        ("crash", 40, None, 0, 3, True, "requeue after crash: committed step none -> 40"),
        ("crash", 40, 20, 1, 3, True, "requeue after crash: committed step 20 -> 40"),
        (
            "crash",
            40,
            40,
            1,
            3,
            False,
            "stopped: no progress in the last attempt (the committed step stayed at 40)",
        ),
        (
            "crash",
            None,
            None,
            0,
            3,
            False,
            "stopped: no progress in the last attempt (no checkpoint was ever committed)",
        ),
        (
            "crash",
            60,
            40,
            3,
            3,
            False,
            "stopped: 3 requeues reached fault_tolerance.max_requeues=3",
        ),
        ("node failure", 40, 20, 0, 3, True, "requeue after node failure: committed step 20 -> 40"),
        ("signal", 120, 100, 2, 3, True, "requeue after signal: committed step 100 -> 120"),
        (
            "signal",
            120,
            100,
            0,
            0,
            False,
            "stopped: 0 requeues reached fault_tolerance.max_requeues=0",
        ),
    ],
)
def test_decide(cause, now, resumed, so_far, cap, requeue, reason) -> None:
    d = decide(Ending(cause, now), RetryBudget(cap), History(resumed, so_far))
    assert (d.requeue, d.reason) == (requeue, reason)


def test_policy_preflight_requeues_without_progress_but_within_the_cap() -> None:
    d = decide(Ending("preflight", None, blamed=("n2",)), RetryBudget(3), History(None, 0))
    assert d.requeue and d.reason == "requeue after preflight, without n2"
    capped = decide(Ending("preflight", None, blamed=("n2",)), RetryBudget(3), History(None, 3))
    assert not capped.requeue


def test_policy_hang_without_blame_needs_progress() -> None:
    d = decide(Ending("hang", 40, blamed=()), RetryBudget(3), History(40, 1))
    assert not d.requeue and "no progress" in d.reason
    d = decide(Ending("hang", 40, blamed=("n1",)), RetryBudget(3), History(40, 1))
    assert d.requeue and d.reason.endswith("without n1")
    same = decide(Ending("crash", 40, blamed=()), RetryBudget(3), History(20, 1))
    assert same == decide(Ending("crash", 40), RetryBudget(3), History(20, 1))


def test_final_state_of_an_attempt_that_is_not_requeued() -> None:
    assert [final_state(c) for c in ("completed", "cancelled", "signal", "crash", "hang")] == [
        "COMPLETED",
        "CANCELLED",
        "STOPPED",
        "FAILED",
        "FAILED",
    ]


@pytest.mark.parametrize("cause", sorted({*RESTART_CAUSES, *REPLACE_CAUSES, "signal", "crash"}))
@pytest.mark.parametrize("blamed", [(), ("n2",)])
@pytest.mark.parametrize("replaceable", [False, True])
def test_decide_restarts_exactly_where_the_restart_rule_allows(cause, blamed, replaceable) -> None:
    # Progress made and budget left: only the rule itself says restart or not.
    d = decide(Ending(cause, 40, blamed=blamed), RetryBudget(3, 3, replaceable), History(20))
    assert d.restart == restartable(cause, blamed, replaceable)


def test_a_final_reason_rules_out_every_retry() -> None:
    budget = RetryBudget(3, 3, True)
    d = decide(Ending("crash", 40, final="every node failed preflight"), budget, History(20))
    assert (d.requeue, d.restart, d.reason) == (False, False, "every node failed preflight")


def test_the_culprit_is_attributions_first_cause() -> None:
    assert Ending("crash", record={"culprit": "rank 1 on node1 killed by SIGKILL"}).culprit == (
        "rank 1 on node1 killed by SIGKILL"
    )
    assert Ending("completed").culprit is None
