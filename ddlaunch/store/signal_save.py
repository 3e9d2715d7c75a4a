"""``health/signal-save-<job>-<restart>.json``: rank 0 saved step N on the pre-timeout signal and
leaves the attempt's conclusion (requeue, or the outcome) to the end hook on the batch host.

Written only when the ranks run in a container (``planning.container.CONCLUDE_ON_HOST_VAR``
is set for them): inside the image there is usually no ``scontrol``, while the host's end hook
has Slurm's commands. Without a container rank 0 concludes itself, since on preemption the
batch shell may never reach the end hook.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.preflight import HEALTH_DIR


def path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / f"signal-save-{attempt.key}.json"


def write(run_dir: Path, attempt: AttemptId, step: int, reason: str) -> None:
    (run_dir / HEALTH_DIR).mkdir(exist_ok=True)
    record = {"step": step, "reason": reason, "time": time.time(), "job_id": attempt.job_id}
    fsutil.atomic_write_json(path(run_dir, attempt), record, 0o600)


def read(run_dir: Path, attempt: AttemptId) -> dict[str, Any] | None:
    try:
        record = fsutil.read_json(path(run_dir, attempt))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
