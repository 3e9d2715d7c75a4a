"""What a pending dependent (``submit --after``) waits for, as ``status`` says it: its
predecessors' current jobs (for status's one squeue call) and the note on its row. Apart from
``app.chain``, which asks the status poll for the predecessors' states at submit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddlaunch.app.runs import RunInfo, read_run
from ddlaunch.app.status import run_status
from ddlaunch.policy import chain
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store import submission


def waiting_jobs(infos: Sequence[RunInfo]) -> list[str]:
    """The predecessors' current jobs of the given runs, for status's one squeue call."""
    out = []
    for info in infos:
        for rec in info.after:
            if rec.run_dir:
                out += submission.job_ids(Path(rec.run_dir))[-1:]
    return out


def waiting_note(
    info: RunInfo, reason: str, queue: Mapping[str, QueueRow], reader: Any
) -> str | None:
    """What a pending dependent waits for (``policy.chain.waiting``), each predecessor's
    state joined from its run directory and the poll's queue rows."""
    items = []
    for rec in info.after:
        if not rec.run_dir or not rec.condition:
            continue
        path = Path(rec.run_dir)
        pred = reader.read(path) if reader is not None else read_run(path)
        state = run_status(pred, queue.get(pred.job_id or "")).state
        items.append(chain.Waited(rec.run_id or path.name, rec.job_id, rec.condition, state))
    return chain.waiting(reason, items)
