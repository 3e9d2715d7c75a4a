"""How a pod carries ddlaunch's conclusion of an attempt to Kubernetes: its exit code (pure).

The retry-or-not decision is ``conclude.conclude`` with ``policy.requeue``, made once per
attempt by the leader pod (node 0); every pod then exits with the code below, and the
rendered objects map the codes onto Kubernetes' own restart machinery
(``planning.kubernetes``):

* ``RETRY_EXIT`` (138): requeue. JobSet: the Job fails (``backoffLimit: 0``) and the
  JobSet's default ``RestartJobSet`` recreates every pod, within ``failurePolicy.maxRestarts``
  = ``fault_tolerance.max_requeues``. PyTorchJob: ``restartPolicy: ExitCode`` recreates a pod
  that exits with a retryable code, and 138 (128 + SIGUSR1) is the training operator's code
  for "retryable by the user's choice"; every pod exits with it, so all are recreated.
* ``STOP_EXIT`` (86): no retry (no progress, the cap reached, cancelled, a final failure).
  JobSet: a ``podFailurePolicy`` rule fails the Job at once (reason ``PodFailurePolicy``) and
  a ``FailJobSet`` rule on that reason ends the JobSet without a restart. PyTorchJob: the
  operator treats every code below 128 other than its retryable ones as permanent.
* 0: completed.
"""

from __future__ import annotations

from ddlaunch.policy.requeue import COMPLETED

RETRY_EXIT = 138
STOP_EXIT = 86


def exit_code(requeued: bool, state: str | None) -> int:
    """The pods' exit code for a concluded attempt: requeued, else by its final state."""
    if requeued:
        return RETRY_EXIT
    return 0 if state == COMPLETED else STOP_EXIT
