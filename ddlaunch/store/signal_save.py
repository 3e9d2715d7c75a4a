"""``health/signal-save-<job>-<restart>.json``: rank 0 saved step N on the pre-timeout signal and
leaves the attempt's conclusion (requeue, or the outcome) to the end hook on the batch host.

Written only when the ranks run in a container (``planning.container.CONCLUDE_ON_HOST_VAR``
is set for them): inside the image there is usually no ``scontrol``, while the host's end hook
has Slurm's commands. Without a container rank 0 concludes itself, since on preemption the
batch shell may never reach the end hook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.preflight import HEALTH_DIR

# What readers rely on; ``SignalSave`` has an attribute for each.
FIELDS = {
    "step": records.INT,
    "reason": records.TEXT,  # the signal
    "time": records.NUMBER,
    "job_id": records.TEXT,
}


@dataclass(frozen=True, kw_only=True)
class SignalSave(records.Record):
    """Rank 0 saved ``step`` on ``reason`` (the signal) and left the conclusion to the host;
    ``read`` gives one only with its step."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = "signal-save"

    step: int | None = None
    reason: str | None = None
    time: float | None = None
    job_id: str | None = None


def path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / f"signal-save-{attempt.key}.json"


def write(run_dir: Path, attempt: AttemptId, step: int, reason: str) -> None:
    (run_dir / HEALTH_DIR).mkdir(exist_ok=True)
    record = SignalSave(step=step, reason=reason, time=time.time(), job_id=attempt.job_id)
    fsutil.atomic_write_json(path(run_dir, attempt), record.to_json(), 0o600)


def read(run_dir: Path, attempt: AttemptId) -> SignalSave | None:
    """The attempt's signal save; None when there is none or it cannot be used (no step
    to conclude on)."""
    found, _ = records.load_json(path(run_dir, attempt), dict)
    record = None if found is None else SignalSave.from_json(found)
    return record if record is not None and record.step is not None else None
