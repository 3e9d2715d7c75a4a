"""The replica groups' restarts for ``ddlaunch report`` (``fault_tolerance.mode:
replica_groups``), pure: each attempt's ``group_restarts`` entries (``store.group_restarts``,
written by the batch host's group supervisor, ``ddlaunch.job.groups``) as the report's rows,
and the bars of the picture's lane per group (the time each restart kept its group out of
the quorum).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddlaunch.policy.group_actions import FAIL_JOB, GIVE_UP, RESTART
from ddlaunch.store import group_restarts as records
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


def from_entry(attempt: int, entry: records.GroupRestart) -> GroupRestart | None:
    """One ``group_restarts`` entry as a row; None when it lacks its group or its time."""
    if entry.group is None or entry.time is None:
        return None
    return GroupRestart(
        attempt=attempt,
        group=entry.group,
        time=float(entry.time),
        cause=entry.cause or "?",
        culprit=entry.culprit or "",
        decision=entry.decision or "",
        why=entry.why or "",
        nodes=entry.nodes or (),
        new_nodes=entry.new_nodes or (),
        failed_at_step=entry.failed_at_step,
        rejoined_step=entry.rejoined_step,
        rejoin_s=None if entry.rejoin_s is None else float(entry.rejoin_s),
        steps_missed=entry.steps_missed,
        healed_from=entry.healed_from,
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
OUTCOMES = {GIVE_UP: "given up", FAIL_JOB: "the job failed"}


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
        if r.decision == RESTART and back is not None:
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
