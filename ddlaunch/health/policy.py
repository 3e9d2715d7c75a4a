"""The requeue decision after a health finding (pure; wraps ``attempts.decide``).

A node that failed preflight, hung or straggled is excluded before the requeue, so the retry
is not blind: it is allowed without the progress test (preflight runs before any step, so it
cannot show progress), within ``fault_tolerance.max_requeues``. A hang with no node to blame
is treated like a crash: requeued only while the committed step advances.
"""

from __future__ import annotations

from collections.abc import Sequence

from ddlaunch import attempts

CAUSE_PREFLIGHT = "preflight"
CAUSE_HANG = "hang"
CAUSE_STRAGGLER = "straggler"
HEALTH_CAUSES = (CAUSE_PREFLIGHT, CAUSE_HANG, CAUSE_STRAGGLER)


def decide(
    *,
    cause: str,
    blamed: Sequence[str],
    committed_now: int | None,
    resumed_from: int | None,
    requeues_so_far: int,
    max_requeues: int,
) -> attempts.Decision:
    common = {
        "committed_now": committed_now,
        "resumed_from": resumed_from,
        "requeues_so_far": requeues_so_far,
        "max_requeues": max_requeues,
    }
    if cause not in HEALTH_CAUSES or blamed:
        decision = attempts.decide(cause=cause, **common)
    else:
        decision = attempts.decide(cause=attempts.CAUSE_CRASH, **common)
        decision = attempts.Decision(
            decision.requeue,
            decision.reason.replace(f"after {attempts.CAUSE_CRASH}", f"after {cause}"),
        )
    if blamed and decision.requeue:
        if cause == CAUSE_PREFLIGHT:
            # No step ran, so "committed step a -> b" says nothing here.
            return attempts.Decision(
                True, f"requeue after preflight, without {','.join(sorted(blamed))}"
            )
        return attempts.Decision(True, f"{decision.reason}, without {','.join(sorted(blamed))}")
    return decision
