"""``outcome.json``: how a run ended (its final state and why), written by whoever concludes
its last attempt; ``cancel.json``: written by ``ddlaunch cancel`` before it calls scancel, so
that the job's own requeue logic knows the stop was wanted."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import NUMBER, TEXT

OUTCOME_FILE = "outcome.json"
CANCEL_FILE = "cancel.json"
FIELDS = {"state": TEXT, "reason": TEXT, "time": NUMBER}  # what readers rely on


@dataclass(frozen=True)
class Outcome:
    """``state``: the run's final state (None: the record names none); ``reason``: why, ""
    when not recorded; ``time``: when it was recorded; ``details``: the record's other keys
    (a local run's duration)."""

    state: str | None = None
    reason: str = ""
    time: float | None = None
    details: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Outcome:
        """The outcome of a JSON object; a field of the wrong kind is dropped (``clean``
        it first to report which)."""
        found = dict(data)
        records.clean(found, FIELDS, OUTCOME_FILE)
        state, reason, when = (
            found.pop("state", None),
            found.pop("reason", None),
            found.pop("time", None),
        )
        return cls(
            state if isinstance(state, str) else None,
            reason if isinstance(reason, str) else "",
            float(when) if isinstance(when, int | float) else None,
            found,
        )


def write_outcome(run_dir: Path, state: str, reason: str = "", **extra: object) -> None:
    record: dict[str, object] = {"state": state, "time": time.time(), **extra}
    if reason:
        record["reason"] = reason
    fsutil.atomic_write_json(run_dir / OUTCOME_FILE, record, 0o600)


def read_outcome(run_dir: Path) -> Outcome | None:
    """How the run ended; None when nobody recorded it or the record cannot be used."""
    found, _ = records.load_json(run_dir / OUTCOME_FILE, dict)
    return None if found is None else Outcome.from_json(found)


def write_cancel(run_dir: Path, job_ids: list[str]) -> None:
    fsutil.atomic_write_json(
        run_dir / CANCEL_FILE, {"time": time.time(), "job_ids": job_ids}, 0o600
    )


def cancel_requested(run_dir: Path) -> bool:
    return (run_dir / CANCEL_FILE).exists()
