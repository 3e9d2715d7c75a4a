"""What the replica groups' ranks tell the batch host's supervisor (``job.groups``), torch-free.

* ``groups/heal-<g>.json``: written by group ``g``'s rank 0 when the group (re)joined the
  others' quorum (healed from a live group, or started with them): the attempt, the group's
  restart count, the step it healed to, when. The supervisor's heal timeout and progress
  guard read it.
* Silence: a group whose nodes' heartbeat records stopped (``store.heartbeats``), the
  trigger for probing its nodes when no rank of it could write a failure record (the whole
  node died).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.heartbeats import node_heartbeat_path

GROUPS_DIR = "groups"


@dataclass(frozen=True)
class HealRecord:
    group: int
    restart: int  # the group's restarts in this attempt when it (re)joined
    job_id: str
    attempt: int  # Slurm's restart count
    relaunch: int  # restarts in the allocation
    step: int  # the step it joined at (healed to)
    healed_from: int | None  # the group it healed from, None: it did not need to heal
    time: float
    seconds: float  # from the group's process start to the join

    def of(self, attempt: AttemptId, group: int, restart: int) -> bool:
        return (
            self.group == group
            and self.restart == restart
            and self.job_id == attempt.job_id
            and self.attempt == attempt.restart
            and self.relaunch == attempt.relaunch
        )


def heal_path(run_dir: Path, group: int) -> Path:
    return run_dir / GROUPS_DIR / f"heal-{group}.json"


def write_heal(run_dir: Path, record: HealRecord) -> None:
    path = heal_path(run_dir, record.group)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(path, asdict(record))


def read_heal(run_dir: Path, group: int) -> HealRecord | None:
    try:
        data = fsutil.read_json(heal_path(run_dir, group))
        return HealRecord(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def rejoined(run_dir: Path, attempt: AttemptId, group: int, restart: int) -> bool:
    """Whether group ``group`` rejoined the others since its ``restart``-th start."""
    found = read_heal(run_dir, group)
    return found is not None and found.of(attempt, group, restart)


def last_beat(run_dir: Path, nodes: tuple[str, ...]) -> float | None:
    """The newest heartbeat merge time of these nodes' records, None without any."""
    beats = []
    for node in nodes:
        try:
            data = fsutil.read_json(node_heartbeat_path(run_dir, node))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("beat"), (int, float)):
            beats.append(float(data["beat"]))
    return max(beats) if beats else None


def silent_since(
    run_dir: Path, nodes: tuple[str, ...], started: float, now: float, stale_after: float
) -> bool:
    """The group's nodes have beaten since its start but not for ``stale_after`` seconds."""
    beat = last_beat(run_dir, nodes)
    return beat is not None and beat >= started - 1.0 and now - beat > stale_after


STATE_FILE = "state.json"
# A group's state in ``groups/state.json`` (``status`` shows them).
TRAINING, HEALING, GIVEN_UP, FINISHED = "training", "healing", "given up", "finished"


@dataclass(frozen=True)
class GroupView:
    """One group as the supervisor last saw it."""

    group: int
    nodes: tuple[str, ...]
    state: str  # TRAINING, HEALING (restarted, not yet rejoined), GIVEN_UP or FINISHED
    restarts: int


@dataclass(frozen=True)
class GroupsState:
    """``groups/state.json``: the supervisor's view of every group of the current attempt,
    rewritten when one changes (a few per failure, not per step)."""

    job_id: str
    attempt: int
    relaunch: int
    time: float
    groups: tuple[GroupView, ...]

    @property
    def live(self) -> int:
        return sum(1 for g in self.groups if g.state in (TRAINING, HEALING, FINISHED))


def write_state(run_dir: Path, state: GroupsState) -> None:
    path = run_dir / GROUPS_DIR / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(state)
    # A crash loses at most the latest view; the attempt record keeps every restart.
    fsutil.atomic_write_json(path, data, durable=False)


def read_state(run_dir: Path) -> GroupsState | None:
    try:
        data = fsutil.read_json(run_dir / GROUPS_DIR / STATE_FILE)
        if not isinstance(data, dict):
            return None
        views = tuple(
            GroupView(int(g["group"]), tuple(g["nodes"]), str(g["state"]), int(g["restarts"]))
            for g in data.get("groups", ())
        )
        return GroupsState(
            str(data["job_id"]),
            int(data["attempt"]),
            int(data["relaunch"]),
            float(data["time"]),
            views,
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None
