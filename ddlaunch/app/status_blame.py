"""Whom ``status`` blames for the latest attempt's failure, and when (pure).

When a node dies, its peers' ranks fail first ("connection closed by peer") and write their
failure records at once; the verdict that names the node comes seconds later (the watchdog's,
with a spare or ``nodes.min``) or when Slurm declares the node down (tens of seconds, then
the next start closes the attempt). A rank's record read in that window names a victim, not
the cause: headlining it as the run's ``FAILED`` blamed the wrong node on a run that was
still RUNNING, then PENDING. So the run's failure headline waits for the run to end; while
it has not, the failure seen is said as pending until a verdict is recorded, then the
verdict is said instead, whichever of the two was written first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ddlaunch.policy.requeue import CAUSE_NODE_FAILURE
from ddlaunch.store.failures import Failure


@dataclass(frozen=True)
class Blame:
    """``headline``: the run's failure (``status``'s ``FAILED`` line); set only once the run
    ended. ``meanwhile``: while the run has not ended and its attempt is open, what failed
    with the verdict pending, or the verdict once it is recorded."""

    headline: str | None = None
    meanwhile: str | None = None


def verdict_words(cause: str | None, nodes: Sequence[str], detail: str | None) -> str:
    """A verdict's blame in the words an attempt's ``culprit`` uses: ``node failure of
    node5: <why>``, ``hang on node2: <detail>``."""
    named = ",".join(nodes)
    what = cause or "failure"
    if what == CAUSE_NODE_FAILURE and named:
        head = f"node failure of {named}"
    else:
        head = f"{what} on {named}" if named else what
    return f"{head}: {detail}" if detail else head


def ended_words(failure: str | None, detail: str | None) -> str:
    """The run's failure and how it ended, as ``status`` and ``report`` head a run that
    ended: ``node failure of node5; stopped: 2 requeues reached
    fault_tolerance.max_requeues=2``. ``failure``: what broke its last attempt (the
    ``headline``); ``detail``: why no attempt followed (its outcome's reason). Either alone
    leaves the user guessing the other; empty when neither is known."""
    failure, detail = failure or "", detail or ""
    if failure and detail and detail not in failure:
        return f"{failure}; {detail}"
    return failure or detail


# A source location that C++ libraries put before their message (gloo: ``[/__w/pytorch/
# pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error ...``).
_SOURCE_PREFIX = re.compile(r"^\[[^\]\s]*:\d+\]\s*")
BRIEF_WIDTH = 160  # of the message in a pending failure's words


def brief_message(message: str) -> str:
    """A rank's message as a pending failure says it: its first line and first sentence,
    without a library's source location, at most ``BRIEF_WIDTH`` characters. A peer's
    collective error is a paragraph of advice around one fact ("Connection reset by peer");
    the whole of it is the rank's log (``ddlaunch logs``)."""
    text = _SOURCE_PREFIX.sub("", message.strip().splitlines()[0] if message.strip() else "")
    end = text.find(". ")
    if end > 0:
        text = text[:end]
    return text if len(text) <= BRIEF_WIDTH else text[: BRIEF_WIDTH - 1] + "\u2026"


def pending_words(failure: Failure) -> str:
    """``rank 3 on node4 failed, verdict pending: RuntimeError: ...``: the ranks and node
    first, and that nothing is decided; the message brief (``brief_message``)."""
    return (
        f"rank {failure.rank} on {failure.host} failed, verdict pending: "
        f"{failure.exception}: {brief_message(failure.message)}"
    )


def blame(
    *,
    ended: bool,
    attempt_open: bool,
    failure: Failure | None,
    verdict: str | None,
    concluded: str | None = None,
) -> Blame:
    """What ``status`` says of the latest attempt's failure.

    ``ended``: the run is in a final state. ``attempt_open``: nothing concluded the latest
    attempt yet. ``failure``: the first rank failure recorded in it that no in-process or
    replica-group restart handled. ``verdict``: the blame a verdict recorded for the open
    attempt (``verdict_words``), None while there is none. ``concluded``: the blame the
    conclusion of a closed attempt recorded (its culprit, else its first failure)."""
    if not attempt_open:
        # A concluded attempt's blame is settled; while the run waits for its next attempt
        # it is history (each attempt's line says it), once the run ended it is the story.
        return Blame(headline=concluded if ended else None)
    if ended:
        # Ended with the attempt left open (the job was killed before its end hook): the
        # verdict, where one came, names the cause; the rank's record may name its victim.
        seen = verdict or (failure.one_line() if failure is not None else None)
        return Blame(headline=seen)
    if verdict is not None:
        return Blame(meanwhile=verdict)
    return Blame(meanwhile=pending_words(failure) if failure is not None else None)
