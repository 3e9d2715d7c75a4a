"""``timings.jsonl``: what checkpointing and restarting cost this run, measured by rank 0 of
Session code (``ddlaunch advise`` reads it). One JSON line per event, appended:

* ``{"kind": "save", "step", "time", "blocking_s", "stall_s", "async_save", "attempt"}``: a
  checkpoint save;
  ``blocking_s`` the time ``save()`` held the training loop, ``stall_s`` that plus the time
  the steps since the previous save waited for its background copy (async saves);
* ``{"kind": "save", "step", "time", "reason", "attempt"}``: a save that is no periodic
  one (``reason``: ``signal``, the save on the stop signal; ``final``, the run's last step):
  when, not what it cost (it blocks the loop by design), so ``advise`` leaves it out;
* ``{"kind": "first_step", "step", "time", "attempt"}``: the first finished step of an
  attempt (its restart cost ends there).

``attempt`` is the attempt's key (``AttemptId.key``, ``attempts.record_key`` of its record).

Appended without fsync (a lost line loses a measurement, never a checkpoint); a torn last
line is skipped by the reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddlaunch.store import records

TIMINGS_FILE = "timings.jsonl"
SAVE, FIRST_STEP = "save", "first_step"
# What readers of a line rely on; ``Timing`` has an attribute for each.
FIELDS = {
    "kind": records.TEXT,
    "step": records.INT,
    "time": records.NUMBER,
    "blocking_s": records.NUMBER,
    "stall_s": records.NUMBER,
    "async_save": records.BOOL,
    "reason": records.TEXT,
    "attempt": records.TEXT,
}


@dataclass(frozen=True, kw_only=True)
class Timing(records.Record):
    """One line of ``timings.jsonl`` (see the module's doc for each kind's fields)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = TIMINGS_FILE

    kind: str | None = None
    step: int | None = None
    time: float | None = None
    blocking_s: float | None = None
    stall_s: float | None = None
    async_save: bool | None = None
    reason: str | None = None
    attempt: str | None = None


def append(run_dir: Path, kind: str, **fields: Any) -> None:
    try:
        with open(run_dir / TIMINGS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"kind": kind, **fields}) + "\n")
    except OSError:  # a measurement, never worth failing a step for
        pass


def read(run_dir: Path) -> list[Timing]:
    """Every line that can be read (a torn last line is skipped); a field of the wrong kind
    is dropped."""
    try:
        text = (run_dir / TIMINGS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(Timing.from_json(record))
    return out
