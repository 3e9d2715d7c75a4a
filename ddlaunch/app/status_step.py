"""Which step a run's line shows (``current_step``, pure): from rank 0's progress and the
watchdog's summary of the heartbeats, never behind what the run's records say it reached."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlaunch.app.runs import RunInfo
from ddlaunch.store.inprocess import of_attempt

if TYPE_CHECKING:
    from ddlaunch.store.watchdog import Summary  # named in annotations only


def current_step(info: RunInfo) -> int | None:
    """The step the run reached, from its records (rank 0's progress, the watchdog's summary
    of the heartbeats), never behind its latest committed checkpoint (a record written before
    a resume would otherwise lag it, or run ahead of a restart that resumed from an earlier
    step).

    While an attempt runs, the records made since it began count, or since its ranks last
    recovered in process (which may have resumed behind the step reached, from RAM or disk):
    the largest of their steps, never behind the step that restart resumed from. Within one
    generation of ranks the step only rises, so every record is a lower bound of it, and the
    largest the nearest. The newest record is not: the watchdog's summary is stamped with its
    poll's time, but its steps are the node records', merged up to a heartbeat interval or
    two before. Taken over rank 0's newer progress, it made the step go back with no restart,
    and, polled just after an in-process restart, say a step from before the failure, behind
    the step the ranks had resumed from. So a summary counts from when it saw its ranks: its
    oldest running beat.

    Without an open attempt (the run ended, or waits for its next attempt) the newest record
    counts, as the last attempt left it."""
    latest = info.attempts[-1] if info.attempts else None
    floor = info.latest_step
    if latest is None or not latest.is_open or latest.start is None:
        best: tuple[float, int] | None = None
        for record in (info.progress, info.watchdog):
            if record is None or record.step is None:
                continue
            when = float(record.time or 0.0)
            if best is None or when >= best[0]:
                best = (when, record.step)
        return _at_least(best[1] if best else None, floor)
    began = latest.start
    restarts = [r for r in of_attempt(latest) if r.recovered and r.time is not None]
    if restarts:
        last = max(restarts, key=lambda r: r.time or 0.0)
        began = max(began, last.time or 0.0)
        floor = _at_least(floor, last.resumed_from)
    seen = []
    if info.progress is not None and float(info.progress.time or 0.0) >= began:
        seen.append(info.progress.step)
    summary = info.watchdog
    if summary is not None and _observed(summary) >= began:
        seen.append(summary.step)
    # a record from before ``began`` is the previous attempt's, or the previous generation's
    return _at_least(max((s for s in seen if s is not None), default=None), floor)


def _observed(summary: Summary) -> float:
    """When the watchdog's summary saw its ranks: its oldest running beat (every rank
    closed: its poll, their records being final)."""
    when = float(summary.time or 0.0)
    return when - float(summary.oldest_beat_age or 0.0) if summary.running else when


def _at_least(step: int | None, floor: int | None) -> int | None:
    steps = [s for s in (step, floor) if s is not None]
    return max(steps) if steps else None
