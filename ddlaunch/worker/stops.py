"""A rank that stops on purpose: our own control flow, never a failure of the rank.

``train.Preempted`` (every rank leaves after the signal save) and ``gate.PreflightFailed`` (a
node failed preflight, no step runs) end the rank function with an exception, because that is
how a training loop is left from inside. They derive from ``StopRank`` so that the rank
function tells them apart from an error of the training code: a failure record
(``store.failures``) names a culprit, and these have none.
"""

from __future__ import annotations


class StopRank(SystemExit):
    """Ends a rank on purpose; ``reason`` says why (printed to the rank's log)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code)
        self.reason = reason
