"""The replica groups' restarts for ``ddlaunch report`` (``fault_tolerance.mode:
replica_groups``), pure: each attempt's ``group_restarts`` entries (written by the batch
host's group supervisor, ``ddlaunch.job.groups``) as typed rows, and the bars of the
picture's lane per group (the time each restart kept its group out of the quorum).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddlaunch.store.attempts import AttemptRecord


@dataclass(frozen=True)
class GroupRestart:
    """One group's failure in one attempt, and what became of it."""

    attempt: int
    group: int
    time: float  # when the supervisor saw it fail
    cause: str
    culprit: str = ""
    decision: str = ""  # restart, give_up or fail_job (policy.groups)
    why: str = ""
    nodes: tuple[str, ...] = ()
    new_nodes: tuple[str, ...] = ()
    failed_at_step: int | None = None
    rejoined_step: int | None = None
    rejoin_s: float | None = None  # its restart -> back in the quorum
    steps_missed: int | None = None
    healed_from: int | None = None  # the group whose state it took

    @property
    def back(self) -> float | None:
        """When it was back in the quorum, if it came back."""
        return None if self.rejoin_s is None else self.time + self.rejoin_s


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(n) for n in value) if isinstance(value, list | tuple) else ()


def from_entry(attempt: int, entry: Mapping[str, Any]) -> GroupRestart | None:
    """One ``group_restarts`` entry; None when it lacks its group or its time."""
    group, when = _int(entry.get("group")), _num(entry.get("time"))
    if group is None or when is None:
        return None
    return GroupRestart(
        attempt=attempt,
        group=group,
        time=when,
        cause=str(entry.get("cause") or "?"),
        culprit=str(entry.get("culprit") or ""),
        decision=str(entry.get("decision") or ""),
        why=str(entry.get("why") or ""),
        nodes=_names(entry.get("nodes")),
        new_nodes=_names(entry.get("new_nodes")),
        failed_at_step=_int(entry.get("failed_at_step")),
        rejoined_step=_int(entry.get("rejoined_step")),
        rejoin_s=_num(entry.get("rejoin_s")),
        steps_missed=_int(entry.get("steps_missed")),
        healed_from=_int(entry.get("healed_from")),
    )


def from_attempts(attempts: Sequence[AttemptRecord]) -> list[GroupRestart]:
    """Every attempt's group restarts, in time order."""
    out = []
    for i, rec in enumerate(attempts):
        number = rec.attempt if rec.attempt is not None else i
        for entry in rec.group_restarts or ():
            row = from_entry(number, entry)
            if row is not None:
                out.append(row)
    return sorted(out, key=lambda r: (r.time, r.group))


# A restart's decision other than "restart" (policy.groups), as a bar's label says it.
OUTCOMES = {"give_up": "given up", "fail_job": "the job failed"}


@dataclass(frozen=True)
class GroupBar:
    """One bar on group ``lane``'s lane: from its failure to its return (or, a group that
    did not come back, to the attempt's end); ``open``: it never came back."""

    lane: int
    start: float
    end: float
    cause: str
    label: str
    open: bool


def bars(
    restarts: Sequence[GroupRestart], attempt_ends: Mapping[int, float | None]
) -> list[GroupBar]:
    """The picture's bars, one per group restart (``attempt_ends``: attempt -> its end)."""
    out = []
    for r in restarts:
        back = r.back
        end = back if back is not None else attempt_ends.get(r.attempt) or r.time
        label = f"{r.cause}"
        if r.decision == "restart" and back is not None:
            label += f", back in {r.rejoin_s:.1f} s"
            if r.healed_from is not None:
                label += f" from group {r.healed_from}"
        elif r.decision in OUTCOMES:
            label += f", {OUTCOMES[r.decision]}"
        out.append(GroupBar(r.group, r.time, max(end, r.time), r.cause, label, back is None))
    return out


def lanes(restarts: Sequence[GroupRestart], groups: int = 0) -> list[int]:
    """The groups drawn: every group of the job (``groups``, when known) and any restarted."""
    return sorted(set(range(groups)) | {r.group for r in restarts})
