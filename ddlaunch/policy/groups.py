"""What happens to a replica group whose step failed (``fault_tolerance.mode:
replica_groups``): restart it alone, give it up, or fail the whole job. Pure: the batch
host's supervisor (``ddlaunch.job.groups``) gathers the facts and acts.

The rules, in order:

* the group's nodes, less the dead or blamed ones, filled up from the allocation's free
  usable nodes (hot spares; nodes no other live group uses): too few is giving up;
* ``max_restarts`` counts per group: a group restarted that often is given up;
* the progress guard, per group: a group restarted before whose last start never rejoined
  the others (it never healed, or never committed a step) is given up rather than started
  again in a loop;
* a restarted group reads nothing from disk and heals from a group that trains: with none
  left (the others failed with it, or are restarting themselves) it cannot restart, and the
  job restarts from its latest checkpoint instead (below), rather than every group training
  on from step 0;
* giving a group up leaves fewer live groups: below ``min_replica_groups`` (or none at all)
  is a failure of the whole job, which the end hook concludes as today (restart in the
  allocation or requeue from the latest complete checkpoint);
* a group that finishes training ends the restarted groups that have not rejoined yet
  (``too_late``): the groups train in lockstep, so the training is done, and a group coming
  back now would find no one to heal from and start over from step 0.

A group's life is one ``Phase`` with explicit moves (``TRANSITIONS``): training, healing
(restarted, not back in the quorum), failed (its step ended, the decision pending), finished
or given up. ``StepEnd`` is a watch's verdict that a running group's step must end.

``hung_groups`` is the hang verdict per group: the watchdog's rule
(``policy.heartbeats.detect_hang``) on each group's own heartbeats, and which of the stalled
groups hang themselves rather than wait for a hung peer (its docstring).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from ddlaunch.policy.group_actions import FAIL_JOB, GIVE_UP, RESTART
from ddlaunch.policy.heartbeats import CAUSE_HANG, Finding, Thresholds
from ddlaunch.wording import counted, plural


class Phase(Enum):
    """Where a replica group is in its life (``TRANSITIONS``: the moves allowed)."""

    TRAINING = "training"  # its step runs and it is in the quorum (a first start: from the outset)
    HEALING = "healing"  # restarted: its step runs, not back in the quorum yet
    FAILED = "failed"  # its step ended in failure; what becomes of it is not decided yet
    FINISHED = "finished"  # its step ended with every rank finished
    GIVEN_UP = "given up"  # no step any more in this attempt


# A group's life, every move it can make. A failed group restarts (healing) or is given
# up; a healing one rejoins, fails again, finishes, or is given up when a peer finished
# first (``too_late``); finished and given up are final.
TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.TRAINING: frozenset({Phase.FAILED, Phase.FINISHED}),
    Phase.HEALING: frozenset({Phase.TRAINING, Phase.FAILED, Phase.FINISHED, Phase.GIVEN_UP}),
    Phase.FAILED: frozenset({Phase.HEALING, Phase.GIVEN_UP}),
    Phase.FINISHED: frozenset(),
    Phase.GIVEN_UP: frozenset(),
}


@dataclass(frozen=True)
class GroupState:
    """One replica group as the supervisor knows it: its nodes, its restarts in this
    attempt and its ``Phase``; each move is a new value (``to``)."""

    group: int
    nodes: tuple[str, ...]
    restarts: int = 0  # restarts of this group in this attempt
    phase: Phase = Phase.TRAINING

    @property
    def live(self) -> bool:
        return self.phase in (Phase.TRAINING, Phase.HEALING, Phase.FINISHED)

    @property
    def running(self) -> bool:
        """Its step runs (training or healing)."""
        return self.phase in (Phase.TRAINING, Phase.HEALING)

    def to(self, phase: Phase) -> GroupState:
        """This group moved to ``phase``; a move ``TRANSITIONS`` does not allow is a bug of
        the supervisor's."""
        if phase not in TRANSITIONS[self.phase]:
            raise ValueError(
                f"group {self.group}: no move from {self.phase.value} to {phase.value}"
            )
        return replace(self, phase=phase)

    def restarted(self, nodes: tuple[str, ...]) -> GroupState:
        """A failed group started again on ``nodes``: healing, one restart more."""
        return replace(self.to(Phase.HEALING), nodes=nodes, restarts=self.restarts + 1)


@dataclass(frozen=True)
class GroupDecision:
    action: str  # RESTART, GIVE_UP or FAIL_JOB
    reason: str
    nodes: tuple[str, ...] = ()  # RESTART: the nodes the group restarts on
    replaced: tuple[tuple[str, str], ...] = ()  # (left-out node, the spare in its place)


@dataclass(frozen=True)
class StepEnd:
    """A watch's verdict that a running group's step must end (the supervisor ends it and
    then handles the group as failed). ``why``: said in the batch log, and the recorded
    cause where no verdict names one; ``cause`` and ``detail``: a verdict's (``hang``,
    ``straggler``), the record's cause and culprit; ``blamed``: the nodes the verdict names;
    ``avoid``: nodes the restart must leave out (a straggler); ``dead``: nodes found dead."""

    why: str
    cause: str = ""
    detail: str = ""
    blamed: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    dead: tuple[str, ...] = ()


def free_nodes(
    allocation: Sequence[str], groups: Sequence[GroupState], unusable: set[str]
) -> list[str]:
    """The allocation's usable nodes no live group holds, in allocation order: the spares."""
    held = {n for g in groups if g.phase is not Phase.GIVEN_UP for n in g.nodes}
    return [n for n in allocation if n not in held and n not in unusable]


def restart_nodes(
    failed: GroupState, unusable: set[str], spares: Sequence[str]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None:
    """The failed group's nodes with each unusable one replaced by a spare (in order), or
    None when the spares do not cover them."""
    left = [n for n in failed.nodes if n in unusable]
    if len(left) > len(spares):
        return None
    swap = dict(zip(left, spares, strict=False))
    return tuple(swap.get(n, n) for n in failed.nodes), tuple(swap.items())


def decide(
    failed: GroupState,
    groups: Sequence[GroupState],
    *,
    unusable: set[str],
    spares: Sequence[str],
    max_restarts: int,
    min_groups: int,
) -> GroupDecision:
    """What to do with ``failed``, the group as it was when its step ended in failure
    (training or healing); ``groups``: every group, the failed one included."""
    others_live = sum(1 for g in groups if g.group != failed.group and g.live)
    # The groups a restarted one can heal from: training, and in the quorum since their start.
    sources = sum(1 for g in groups if g.group != failed.group and g.phase is Phase.TRAINING)
    placed = restart_nodes(failed, unusable, spares)
    if placed is None:
        lost = ", ".join(sorted(n for n in failed.nodes if n in unusable))
        why = f"no spare node left for {lost}"
    elif failed.restarts >= max_restarts:
        why = f"it used its fault_tolerance.max_restarts ({max_restarts})"
    elif failed.restarts > 0 and failed.phase is Phase.HEALING:
        why = "its last restart never rejoined the other groups"
    elif sources == 0 and any(g.phase is Phase.FINISHED for g in groups if g.group != failed.group):
        return GroupDecision(
            GIVE_UP, f"group {failed.group} is given up: the other groups finished training"
        )
    elif sources == 0:
        return GroupDecision(
            FAIL_JOB,
            f"group {failed.group} cannot restart: no other group trains to heal it from "
            "(the job restarts from its latest checkpoint)",
        )
    else:
        nodes, replaced = placed
        moved = "; ".join(f"{a} -> {b}" for a, b in replaced)
        where = f"on {','.join(nodes)}" + (f" ({moved})" if moved else "")
        return GroupDecision(RESTART, f"restart group {failed.group} {where}", nodes, replaced)
    if others_live < max(min_groups, 1):
        return GroupDecision(
            FAIL_JOB,
            f"group {failed.group} cannot restart ({why}) and "
            f"{counted(others_live, 'live group')} {plural(others_live, 'is', 'are')} fewer than "
            f"fault_tolerance.min_replica_groups ({min_groups})",
        )
    return GroupDecision(
        GIVE_UP,
        f"group {failed.group} is given up ({why}); "
        f"{counted(others_live, 'group')} {plural(others_live, 'goes', 'go')} on",
    )


def too_late(groups: Sequence[GroupState]) -> list[int]:
    """The restarted groups still healing once some group finished training: they can no
    longer rejoin (the module's last rule), so they are ended and given up, not failed."""
    if not any(g.phase is Phase.FINISHED for g in groups):
        return []
    return [g.group for g in groups if g.phase is Phase.HEALING]


def group_nodes(nodes: Sequence[str], groups: int) -> list[tuple[str, ...]]:
    """The step's nodes cut into ``groups`` equal runs of consecutive nodes (group g holds
    nodes [g*k, (g+1)*k)); the config's validation makes the count divisible."""
    if groups < 1 or len(nodes) % groups:
        raise ValueError(
            f"{counted(len(nodes), 'node')} {plural(len(nodes), 'does', 'do')} not split into "
            f"{groups} equal groups"
        )
    k = len(nodes) // groups
    return [tuple(nodes[g * k : (g + 1) * k]) for g in range(groups)]


@dataclass(frozen=True)
class GroupBeats:
    """What one watched group's heartbeats say (a group that has rejoined the others since
    its last start; a healing one answers to ``heal_timeout`` instead)."""

    group: int
    finding: Finding | None  # policy.heartbeats.detect_hang on the group's own beats
    last_step: float  # policy.heartbeats.last_progress of them
    frozen: bool  # every running rank's heartbeat went stale (policy.heartbeats.frozen)


@dataclass(frozen=True)
class HangVerdict:
    """``hung``: the groups to end and restart, each with its finding; ``whole_job``: every
    watched group is stalled and none can be singled out: a hang of the job."""

    hung: tuple[tuple[int, Finding], ...] = ()
    whole_job: Finding | None = None


def hung_groups(
    watched: Sequence[GroupBeats], now: float, t: Thresholds, changed: float = 0.0
) -> HangVerdict:
    """Which stalled groups hang. A group that hangs stalls the others too (torchft waits for
    it in the quorum and the cross-group all-reduce), so a stalled group is hung only on
    evidence that it, not a peer, stopped:

    1. its own verdict blames a node (a frozen, lagging or stuck rank among its live ones);
    2. every rank of it froze while some watched group's did not (a one-node group whose
       node leader stopped: the group's own rule sees no difference between its ranks);
    3. without either anywhere: the other groups finished steps at least half a
       ``hang_timeout`` after its last one (they are not waiting for it, nor it for them).

    Stalled groups without evidence wait: they are the victims of a hung peer and train again
    once it is ended. Every watched group stalled with no evidence for ``stale_after`` past
    the timeout (time enough for a frozen rank's heartbeat to go stale), counted from the
    latest step or from ``changed`` (when a group was last ended or started: the others may
    have waited for it), is a hang of the whole job; so is every watched group hung at once:
    restarting them all would leave no group to heal from, and the job restarts from its
    latest checkpoint instead.
    """
    # A group is judged only on a stall that outlasts ``changed`` by the timeout: until a
    # peer was ended, the group may have been waiting for it inside torchft, and its ranks
    # then look stuck or lagging to its own rule for a moment after the peer's end (they
    # leave the cross-group collective one by one), evidence that blames the group's nodes
    # wrongly.
    stalled = [
        w
        for w in watched
        if w.finding is not None and now - max(w.last_step, changed) >= t.hang_timeout
    ]
    if not stalled:
        return HangVerdict()
    all_frozen = all(w.frozen for w in watched)
    hung = [w for w in stalled if (w.finding and w.finding.nodes) or (w.frozen and not all_frozen)]
    if not hung:
        newest = max(w.last_step for w in watched)
        hung = [w for w in stalled if newest - w.last_step >= t.hang_timeout / 2]
    if hung and len(hung) < len(watched):
        return HangVerdict(tuple((w.group, _group_finding(w)) for w in hung))
    idle = now - max(w.last_step for w in watched)
    quiet = min(idle, now - changed)
    if len(stalled) == len(watched) and (hung or quiet >= t.hang_timeout + t.stale_after):
        names = ", ".join(str(w.group) for w in watched)
        return HangVerdict(
            whole_job=Finding(
                CAUSE_HANG,
                tuple(sorted({n for w in hung for n in _group_finding(w).nodes})),
                f"every replica group ({names}) stopped: no step finished for {idle:.0f} s "
                f"(hang_timeout {t.hang_timeout:.0f} s); "
                + ("all of them hang" if hung else "no single group to blame"),
            )
        )
    return HangVerdict()


def _group_finding(w: GroupBeats) -> Finding:
    assert w.finding is not None
    if w.finding.nodes or not w.frozen:
        return w.finding
    return Finding(
        CAUSE_HANG,
        w.finding.nodes,
        f"{w.finding.detail}; every rank of group {w.group} stopped beating while the other "
        "groups' ranks beat (its processes are frozen)",
        w.finding.ranks,
    )


# What a collective across the groups may take at the least: a peer that died closes its
# sockets and is seen at once; this bounds a slow one.
COLLECTIVE_FLOOR_S = 30.0
# Beyond the hang verdict's window: one supervisor poll, ending the hung group's step.
COLLECTIVE_MARGIN_S = 30.0


def collective_timeout_s(thresholds: Thresholds, watchdog: bool) -> float:
    """How long a group waits in a collective across the groups before it counts as an
    error of its own. A frozen rank keeps its sockets open, so its peers in the other
    groups wait in the all-reduce until the hung group is ended (its sockets close and they
    go on) or this timeout expires, whichever comes first. The supervisor judges a group
    hung after ``hang_timeout`` plus the heartbeats' staleness; the timeout is longer, so
    that the hung group is ended first and the groups that only waited train on. With
    the timeout first, the waiting groups failed themselves (torchft's error path after a
    gloo timeout left the group's ranks at different points of the step: seen as a
    transport error and a commit timeout), and, with no group left to heal from, the whole
    job restarted from its checkpoint. Without the watchdog there is no verdict to wait
    for: the floor."""
    if not watchdog:
        return COLLECTIVE_FLOOR_S
    window = thresholds.hang_timeout + thresholds.stale_after
    return max(COLLECTIVE_FLOOR_S, window + COLLECTIVE_MARGIN_S)


@dataclass(frozen=True)
class ReplicaTimeouts:
    """How long a rank of a replica group waits, in seconds, on each thing torchft makes it
    wait on (``replica_timeouts``)."""

    collective: float  # a collective across the groups (the process group's timeout)
    operation: float  # one of the manager's own: the commit vote, above all
    quorum: float  # the quorum: a restarted group waits this long for the others'


def replica_timeouts(
    thresholds: Thresholds, watchdog: bool, heal_timeout: float
) -> ReplicaTimeouts:
    """Every wait of a rank that a hung group can prolong outlasts the hang verdict
    (``collective_timeout_s``), not only the collective itself. A frozen rank holds its peer
    in another group in the all-reduce; that peer's group partner, whose half of the
    all-reduce went through, waits for it in the group's commit vote, and then in the next
    quorum. Seen with the vote on a 30 s timeout and a 38 s verdict: the group that only
    waited timed out in its vote and failed, and, the frozen group being unable to heal it,
    the whole job restarted. The quorum waits at least ``heal_timeout`` as well: a restarted
    group waits that long for the others'."""
    wait = collective_timeout_s(thresholds, watchdog)
    return ReplicaTimeouts(collective=wait, operation=wait, quorum=max(wait, heal_timeout))
