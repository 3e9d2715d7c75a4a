"""``groups/``: what the replica groups of ``fault_tolerance.mode: replica_groups`` say about
themselves, for the batch host's group supervisor.

* ``groups/step-<g>.json`` (``GroupStep``): the last step group ``g`` committed, rewritten by
  the group's rank 0 at most every ``STEP_EVERY_S`` seconds. A restarted group whose file
  does not move past its restart time has not healed (yet); one whose step advances is
  training.
* ``groups/heal-<g>-<restart>.json`` (``HealRecord``): group ``g``, started for the
  ``restart``-th time, took a live peer's state (group ``healed_from_group``) at step
  ``healed_from_step``: written once, by the group's rank 0, right after the heal.

Torch-free; one small file per group, so the records of a 1,000-group job are 1,000 files
rewritten a few times a minute, never one per rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ddlaunch import fsutil

GROUPS_DIR = "groups"
STEP_FILE = "step-{group}.json"
HEAL_FILE = "heal-{group}-{restart}.json"
# How often a group's rank 0 rewrites its step file at most: a few writes a minute per group.
STEP_EVERY_S = 5.0


@dataclass(frozen=True, kw_only=True)
class GroupStep:
    """``step``: the group's last committed step; ``time``: when it was written (epoch s)."""

    group: int
    restart: int
    step: int
    time: float


@dataclass(frozen=True, kw_only=True)
class HealRecord:
    """``healed_from_step``: the step of the peer's state the group took (its new step);
    ``step_before``: the group's own step before (0 for a group that restarted from
    nothing); ``healed_at``: epoch seconds; ``seconds_from_start``: from the start of the
    group's rank 0 process (torch's import included) to the healed state;
    ``healed_from_group``: the group whose state it took (None: not known, a record of an
    earlier version or a peer that did not say)."""

    group: int
    restart: int
    healed_from_step: int
    step_before: int
    healed_at: float
    seconds_from_start: float
    healed_from_group: int | None = None


def step_path(run_dir: Path, group: int) -> Path:
    return run_dir / GROUPS_DIR / STEP_FILE.format(group=group)


def heal_path(run_dir: Path, group: int, restart: int) -> Path:
    return run_dir / GROUPS_DIR / HEAL_FILE.format(group=group, restart=restart)


def write_step(run_dir: Path, record: GroupStep) -> None:
    path = step_path(run_dir, record.group)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(path, dataclasses.asdict(record))


def write_heal(run_dir: Path, record: HealRecord) -> None:
    path = heal_path(run_dir, record.group, record.restart)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(path, dataclasses.asdict(record))


def _read(path: Path) -> dict[str, object] | None:
    try:
        value = fsutil.read_json(path)
    except ValueError:  # cut short or not JSON: as good as absent to a reader that polls
        return None
    return value if isinstance(value, dict) else None


def read_step(run_dir: Path, group: int) -> GroupStep | None:
    raw = _read(step_path(run_dir, group))
    try:
        return GroupStep(**raw) if raw else None  # type: ignore[arg-type]
    except TypeError:  # fields missing or unknown
        return None


def read_heal(run_dir: Path, group: int, restart: int) -> HealRecord | None:
    raw = _read(heal_path(run_dir, group, restart))
    try:
        return HealRecord(**raw) if raw else None  # type: ignore[arg-type]
    except TypeError:
        return None
