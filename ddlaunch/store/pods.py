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
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.layout import KUBERNETES_DIR

# What readers of a decision rely on; ``Decision`` has an attribute for each.
DECISION_FIELDS = {
    "exit_code": records.INT,
    "state": records.TEXT,
    "reason": records.TEXT,
    "time": records.NUMBER,
}


@dataclass(frozen=True, kw_only=True)
class PodDecision(records.Record):
    """The leader pod's conclusion of an attempt: the exit code every pod leaves with, the
    run's final state (None: it goes on), why, and when."""

    FIELDS: ClassVar[records.Fields] = DECISION_FIELDS
    NAME: ClassVar[str] = "pod decision"

    exit_code: int | None = None
    state: str | None = None
    reason: str | None = None
    time: float | None = None


def decision_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / KUBERNETES_DIR / f"exit-{attempt.key}.json"


def write_decision(
    run_dir: Path, attempt: AttemptId, exit_code: int, state: str | None, reason: str
) -> None:
    # from_json: a state None (the run goes on) is recorded as null
    found = {"exit_code": exit_code, "state": state, "reason": reason, "time": time.time()}
    record = PodDecision.from_json(found)
    fsutil.atomic_write_json(decision_path(run_dir, attempt), record.to_json(), 0o600)


def read_decision(run_dir: Path, attempt: AttemptId) -> PodDecision | None:
    """The leader's decision; None until there is one with an exit code (a foreign or
    damaged file is none)."""
    found, _ = records.load_json(decision_path(run_dir, attempt), dict)
    record = None if found is None else PodDecision.from_json(found)
    return record if record is not None and record.exit_code is not None else None


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
