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


def _run(endings: list[Ending], budget: RetryBudget) -> list[str]:
    """The decisions of a run whose attempts end as ``endings``, one after the other, each
    attempt resuming from the step the one before committed; up to the first that stops."""
    history, said = History(), []
    for ending in endings:
        d = decide(ending, budget, history)
        said.append(d.reason)
        if not d.retry:
            break
        history = History(
            ending.committed_step,
            history.requeues + int(d.requeue),
            history.restarts + int(d.restart),
        )
    return said


def _dead(node: str, committed: int | None = None) -> Ending:
    return Ending("node failure", committed, blamed=(node,))


NONE_TO_NONE = "after node failure: committed step none -> none"


def test_a_dead_node_before_the_first_checkpoint_restarts_on_the_spare_from_scratch() -> None:
    d = decide(_dead("node2"), RetryBudget(3, 3, replaceable=True), History())
    assert (d.restart, d.requeue) == (True, False)
    assert d.reason == f"restart in the allocation {NONE_TO_NONE}, without node2 (restart 1 of 3)"


def test_a_dead_node_before_the_first_checkpoint_requeues_excluding_it_without_a_spare() -> None:
    d = decide(_dead("node2"), RetryBudget(3, 3, replaceable=False), History())
    assert (d.restart, d.requeue) == (False, True)
    assert d.reason == f"requeue {NONE_TO_NONE}, without node2"


@pytest.mark.parametrize("replaceable", [True, False])
def test_the_progress_guard_still_stops_code_that_fails_without_committing(
    replaceable: bool,
) -> None:
    # The dead node is retried without it; the crash that follows on good nodes is the
    # code's: without a checkpoint since, it stops the run as before.
    budget = RetryBudget(3, 3, replaceable)
    retried = (
        f"restart in the allocation {NONE_TO_NONE}, without node2 (restart 1 of 3)"
        if replaceable
        else f"requeue {NONE_TO_NONE}, without node2"
    )
    assert _run([_dead("node2"), Ending("crash")], budget) == [
        retried,
        "stopped: no progress in the last attempt (no checkpoint was ever committed)",
    ]
    # A node failure that leaves no node out is a crash to the guard.
    assert _run([_dead("node2"), Ending("node failure")], budget)[1:] == [
        "stopped: no progress in the last attempt (no checkpoint was ever committed)"
    ]


def test_the_caps_stop_a_run_whose_nodes_keep_dying_before_any_checkpoint() -> None:
    dying = [_dead(f"node{i}") for i in range(2, 12)]
    assert _run(dying, RetryBudget(max_requeues=2, max_restarts=3, replaceable=True)) == [
        f"restart in the allocation {NONE_TO_NONE}, without node2 (restart 1 of 3)",
        f"restart in the allocation {NONE_TO_NONE}, without node3 (restart 2 of 3)",
        f"restart in the allocation {NONE_TO_NONE}, without node4 (restart 3 of 3)",
        # The restarts used up: a requeue is the fallback, within its own cap.
        f"requeue {NONE_TO_NONE}, without node5",
        f"requeue {NONE_TO_NONE}, without node6",
        "stopped: 3 restarts in the allocation reached fault_tolerance.max_restarts=3, "
        "2 requeues reached fault_tolerance.max_requeues=2",
    ]
    assert _run(dying, RetryBudget(max_requeues=1)) == [
        f"requeue {NONE_TO_NONE}, without node2",
        "stopped: 1 requeue reached fault_tolerance.max_requeues=1",
    ]
