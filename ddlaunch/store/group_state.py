"""``groups/state.json``: the replica groups' supervisor's (``job.groups``) view of every
group of the current attempt, for ``status``. What the groups' ranks write themselves (their
steps, their heals) is ``store.groups``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store.groups import GROUPS_DIR

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
