"""When to save and what to delete: pure functions, no I/O, no clock, no torch.

Conventions (chosen so that a requeued run behaves like an uninterrupted one):

* Step-based saves fall on positive multiples of ``every_steps`` (100, 200, ...), not "N steps
  after the last save": after a resume from step 950 the next save is still at step 1000.
* Time-based saves fire when ``every_minutes`` have passed since ``last_save_time``; pass the
  job's start time there before the first save. With ``last_save_time=None`` the time trigger
  is off (there is nothing to measure from).
* ``None`` or ``0`` disables a trigger; a negative interval is a caller bug (ValueError).
* A step is never saved twice, and never a step at or before the last saved one.
* Retention: ``keep_last=K > 0`` keeps the K newest committed steps; ``K <= 0`` keeps all.

In a distributed job, ``now`` differs between ranks, so the time trigger can disagree across
ranks; a save is a collective, so evaluate it on one rank or agree on the result (see
CheckpointManager.should_save).
"""

from __future__ import annotations

from collections.abc import Iterable


def should_checkpoint(
    step: int,
    now: float,
    last_save_step: int | None,
    last_save_time: float | None,
    every_steps: int | None,
    every_minutes: float | None,
) -> bool:
    """Whether to save after ``step`` (the conventions are in the module docstring)."""
    if every_steps is not None and every_steps < 0:
        raise ValueError(f"every_steps must be >= 0 (0 disables), got {every_steps}")
    if every_minutes is not None and every_minutes < 0:
        raise ValueError(f"every_minutes must be >= 0 (0 disables), got {every_minutes}")
    if last_save_step is not None and step <= last_save_step:
        return False
    if every_steps and step > 0 and step % every_steps == 0:
        return True
    if every_minutes and last_save_time is not None:
        return now - last_save_time >= every_minutes * 60.0
    return False


def to_delete(committed_steps: Iterable[int], keep_last: int) -> list[int]:
    """Committed steps to delete under keep-last-K, oldest first.

    ``keep_last <= 0`` means keep everything (returns []); otherwise the ``keep_last`` newest
    steps are kept, so the newest is never deleted. Duplicates are counted once.
    """
    if keep_last <= 0:
        return []
    steps = sorted(set(committed_steps))
    return steps[:-keep_last]
