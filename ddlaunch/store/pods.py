"""``kubernetes/``: the records of a run's pods on Kubernetes (``--target kubernetes``).

* ``exit-<job>-<restart>.json``: the leader pod's (node 0's) conclusion of an attempt, as the
  exit code every pod of the attempt leaves with (``policy.pod_exit``), its final state and
  why. The other pods wait for it, so the whole gang reports one decision to Kubernetes.
* ``pod-<index>.json``: how often the pod of node ``index`` has started (a PyTorchJob has no
  gang-wide restart counter such as the JobSet's ``restart-attempt`` annotation; every attempt
  recreates every pod, so each pod's own count is the attempt's number).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.layout import KUBERNETES_DIR


def decision_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / KUBERNETES_DIR / f"exit-{attempt.key}.json"


def write_decision(
    run_dir: Path, attempt: AttemptId, exit_code: int, state: str | None, reason: str
) -> None:
    record = {"exit_code": exit_code, "state": state, "reason": reason, "time": time.time()}
    fsutil.atomic_write_json(decision_path(run_dir, attempt), record, 0o600)


def read_decision(run_dir: Path, attempt: AttemptId) -> dict[str, Any] | None:
    try:
        record = fsutil.read_json(decision_path(run_dir, attempt))
    except ValueError:  # a torn write cannot happen; a foreign file can
        return None
    return record if isinstance(record, dict) and "exit_code" in record else None


def next_incarnation(run_dir: Path, index: int) -> int:
    """Count a start of node ``index``'s pod: 0 for its first start, then 1, 2, ..."""
    path = run_dir / KUBERNETES_DIR / f"pod-{index}.json"
    try:
        previous = fsutil.read_json(path)
    except ValueError:
        previous = None
    count = int(previous["starts"]) if isinstance(previous, dict) else 0
    fsutil.atomic_write_json(path, {"starts": count + 1, "time": time.time()}, 0o600)
    return count
