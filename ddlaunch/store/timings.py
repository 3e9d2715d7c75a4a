"""``timings.jsonl``: what checkpointing and restarting cost this run, measured by rank 0 of
Session code (``ddlaunch advise`` reads it). One JSON line per event, appended:

* ``{"kind": "save", "step", "time", "blocking_s", "stall_s", "async_save", "attempt"}``: a
  checkpoint save;
  ``blocking_s`` the time ``save()`` held the training loop, ``stall_s`` that plus the time
  the steps since the previous save waited for its background copy (async saves);
* ``{"kind": "first_step", "step", "time", "attempt"}``: the first finished step of an
  attempt (its restart cost ends there).

``attempt`` is the attempt's key (``AttemptId.key``, ``attempts.record_key`` of its record).

Appended without fsync (a lost line loses a measurement, never a checkpoint); a torn last
line is skipped by the reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TIMINGS_FILE = "timings.jsonl"
SAVE, FIRST_STEP = "save", "first_step"


def append(run_dir: Path, kind: str, **fields: Any) -> None:
    try:
        with open(run_dir / TIMINGS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"kind": kind, **fields}) + "\n")
    except OSError:  # a measurement, never worth failing a step for
        pass


def read(run_dir: Path) -> list[dict[str, Any]]:
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
            out.append(record)
    return out
