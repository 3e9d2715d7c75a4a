"""The one requeue policy (pure): progress guard, cap, health findings with and without a node
to blame, and the final state of an attempt that is not requeued."""

from __future__ import annotations

import pytest

from ddlaunch.policy.requeue import decide, final_state


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
    d = decide(
        cause=cause,
        committed_now=now,
        resumed_from=resumed,
        requeues_so_far=so_far,
        max_requeues=cap,
    )
    assert (d.requeue, d.reason) == (requeue, reason)


def test_policy_preflight_requeues_without_progress_but_within_the_cap() -> None:
    d = decide(
        cause="preflight",
        blamed=["n2"],
        committed_now=None,
        resumed_from=None,
        requeues_so_far=0,
        max_requeues=3,
    )
    assert d.requeue and d.reason == "requeue after preflight, without n2"
    capped = decide(
        cause="preflight",
        blamed=["n2"],
        committed_now=None,
        resumed_from=None,
        requeues_so_far=3,
        max_requeues=3,
    )
    assert not capped.requeue


def test_policy_hang_without_blame_needs_progress() -> None:
    d = decide(
        cause="hang",
        blamed=[],
        committed_now=40,
        resumed_from=40,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert not d.requeue and "no progress" in d.reason
    d = decide(
        cause="hang",
        blamed=["n1"],
        committed_now=40,
        resumed_from=40,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert d.requeue and d.reason.endswith("without n1")
    same = decide(
        cause="crash",
        blamed=[],
        committed_now=40,
        resumed_from=20,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert same == decide(
        cause="crash", committed_now=40, resumed_from=20, requeues_so_far=1, max_requeues=3
    )


def test_final_state_of_an_attempt_that_is_not_requeued() -> None:
    assert [final_state(c) for c in ("completed", "cancelled", "signal", "crash", "hang")] == [
        "COMPLETED",
        "CANCELLED",
        "STOPPED",
        "FAILED",
        "FAILED",
    ]
