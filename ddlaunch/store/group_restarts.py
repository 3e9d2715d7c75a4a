"""A replica group restarted alone (``fault_tolerance.mode: replica_groups``), as the attempt
record holds it: one ``group_restarts`` entry of ``attempts.json`` per failed group, written
by the batch host's group supervisor (``job.groups``) when the group failed, and completed
when it rejoined the others (``rejoined``) or was ended before it could (``ended_early``).

Here: ``GroupRestart``, the one typed entry, which the supervisor writes and every reader
(``status``, ``report``, ``advise``) reads; ``GROUP_RESTARTS``, the attempt record's field of
them (``AttemptRecord.group_restarts``); ``describe``, an entry in one line for ``status``.
Torch-free, no Slurm calls; it imports no other record module (``store.attempts`` imports
it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ddlaunch.policy.group_actions import RESTART
from ddlaunch.store import records
from ddlaunch.store.records import BOOL, INT, NUMBER, OBJECTS, STRINGS, TEXT
from ddlaunch.wording import counted

# In the order the supervisor writes them: an entry read and rewritten keeps its bytes.
FIELDS = {
    "group": INT,
    "restart": INT,  # the group's restarts before this one
    "time": NUMBER,  # when the supervisor saw it fail (epoch s)
    "up_s": NUMBER,  # its step's time up
    "cause": TEXT,
    "culprit": TEXT,  # the rank that ended it, or the verdict's detail
    "causes": OBJECTS,  # the ranked causes (``policy.attribution``)
    "nodes": STRINGS,  # its nodes when it failed
    "exit_code": INT,  # srun's (null: not known)
    "decision": TEXT,  # policy.groups' action: RESTART, GIVE_UP or FAIL_JOB
    "why": TEXT,
    "new_nodes": STRINGS,  # a restart's nodes
    "blamed": STRINGS,  # the nodes a verdict named
    "rest_killed_s": NUMBER,  # how long its other ranks outlived the first one's end
    "failed_at_step": INT,
    # Its rejoin (``rejoined``):
    "steps_missed": INT,
    "rejoined_step": INT,
    "healed": BOOL,  # it took a live group's state (False: it needed none)
    "rejoin_s": NUMBER,  # its restart -> back in the quorum
    "healed_from": INT,  # the group whose state it took
    "ended": TEXT,  # why it was ended before it rejoined (``ended_early``)
}


@dataclass(frozen=True, kw_only=True)
class GroupRestart(records.Record):
    """One group's failure in one attempt and what became of it: an attribute per
    ``FIELDS`` entry (``records.Record``: None where the entry has none, ``extra`` and
    ``nulls`` kept as read)."""

    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = "attempts.json group_restarts"

    group: int | None = None
    restart: int | None = None
    time: float | None = None
    up_s: float | None = None
    cause: str | None = None
    culprit: str | None = None
    causes: tuple[Mapping[str, Any], ...] | None = None
    nodes: tuple[str, ...] | None = None
    exit_code: int | None = None
    decision: str | None = None
    why: str | None = None
    new_nodes: tuple[str, ...] | None = None
    blamed: tuple[str, ...] | None = None
    rest_killed_s: float | None = None
    failed_at_step: int | None = None
    steps_missed: int | None = None
    rejoined_step: int | None = None
    healed: bool | None = None
    rejoin_s: float | None = None
    healed_from: int | None = None
    ended: str | None = None

    @property
    def back(self) -> float | None:
        """When it was back in the quorum, if it came back."""
        if self.time is None or self.rejoin_s is None:
            return None
        return self.time + self.rejoin_s

    def rejoined(
        self, step: int, healed: bool, after: float, source: int | None = None
    ) -> GroupRestart:
        """This entry with the group's rejoin: at ``step``, ``after`` seconds, healed (from
        group ``source``, where known) or not."""
        change: dict[str, object] = {}
        if self.failed_at_step is not None:
            change["steps_missed"] = max(step - self.failed_at_step, 0)
        change.update(rejoined_step=step, healed=healed, rejoin_s=round(after, 3))
        if source is not None:
            change["healed_from"] = source
        return self.updated(**change)

    def ended_early(self, why: str) -> GroupRestart:
        """This entry with why the group was ended before it rejoined."""
        return self.updated(ended=why)


# ``AttemptRecord.group_restarts``'s kind: each entry typed as read, written back as read.
GROUP_RESTARTS = records.typed_objects(GroupRestart.from_json, GroupRestart.to_json)


def last_time(entries: Sequence[GroupRestart]) -> float:
    """When the latest of ``entries`` was handled; minus infinity when none says."""
    return max((float(e.time) for e in entries if e.time is not None), default=float("-inf"))


def describe(r: GroupRestart) -> str:
    """One group's failure inside an attempt in one line: what failed, what was decided,
    how it rejoined."""
    up = f" after {r.up_s:.0f}s" if r.up_s is not None else ""
    text = f"group {r.group} failed{up}: {r.cause or '?'}"
    if r.culprit and r.culprit != r.cause:
        text += f" ({r.culprit})"
    if r.decision == RESTART:
        text += f"; restarted on {','.join(r.new_nodes or ())}"
        if r.rejoined_step is not None:
            healed = f", healed from group {r.healed_from}" if r.healed_from is not None else ""
            text += f"; rejoined at step {r.rejoined_step} in {r.rejoin_s or 0:.1f}s{healed}"
            if r.steps_missed is not None:
                text += f", {counted(r.steps_missed, 'step')} missed"
        elif r.ended:
            text += f"; ended: {r.ended}"
    elif r.why:
        text += f"; {r.why}"
    return text
