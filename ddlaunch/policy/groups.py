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
* giving a group up leaves fewer live groups: below ``min_replica_groups`` (or none at all)
  is a failure of the whole job, which the end hook concludes as today (restart in the
  allocation or requeue from the latest complete checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RESTART = "restart"
GIVE_UP = "give_up"
FAIL_JOB = "fail_job"


@dataclass(frozen=True)
class GroupState:
    """One replica group as the supervisor knows it."""

    group: int
    nodes: tuple[str, ...]
    restarts: int = 0  # restarts of this group in this attempt
    running: bool = True  # its step is running (or it is being restarted)
    done: bool = False  # its step ended with every rank finished
    given_up: bool = False
    rejoined: bool = True  # since its last (re)start it healed and committed a step

    @property
    def live(self) -> bool:
        return not self.given_up and (self.running or self.done)


@dataclass(frozen=True)
class GroupDecision:
    action: str  # RESTART, GIVE_UP or FAIL_JOB
    reason: str
    nodes: tuple[str, ...] = ()  # RESTART: the nodes the group restarts on
    replaced: tuple[tuple[str, str], ...] = ()  # (left-out node, the spare in its place)


def free_nodes(
    allocation: Sequence[str], groups: Sequence[GroupState], unusable: set[str]
) -> list[str]:
    """The allocation's usable nodes no live group holds, in allocation order: the spares."""
    held = {n for g in groups if not g.given_up for n in g.nodes}
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
    """What to do with ``failed`` (one of ``groups``, whose step just ended in failure)."""
    others_live = sum(1 for g in groups if g.group != failed.group and g.live)
    placed = restart_nodes(failed, unusable, spares)
    if placed is None:
        lost = ", ".join(sorted(n for n in failed.nodes if n in unusable))
        why = f"no spare node left for {lost}"
    elif failed.restarts >= max_restarts:
        why = f"it used its fault_tolerance.max_restarts ({max_restarts})"
    elif failed.restarts > 0 and not failed.rejoined:
        why = "its last restart never rejoined the other groups"
    else:
        nodes, replaced = placed
        moved = "; ".join(f"{a} -> {b}" for a, b in replaced)
        where = f"on {','.join(nodes)}" + (f" ({moved})" if moved else "")
        return GroupDecision(RESTART, f"restart group {failed.group} {where}", nodes, replaced)
    if others_live < max(min_groups, 1):
        return GroupDecision(
            FAIL_JOB,
            f"group {failed.group} cannot restart ({why}) and {others_live} live group(s) "
            f"are fewer than fault_tolerance.min_replica_groups ({min_groups})",
        )
    return GroupDecision(
        GIVE_UP, f"group {failed.group} is given up ({why}); {others_live} group(s) go on"
    )


def group_nodes(nodes: Sequence[str], groups: int) -> list[tuple[str, ...]]:
    """The step's nodes cut into ``groups`` equal runs of consecutive nodes (group g holds
    nodes [g*k, (g+1)*k)); the config's validation makes the count divisible."""
    if groups < 1 or len(nodes) % groups:
        raise ValueError(f"{len(nodes)} nodes do not split into {groups} equal groups")
    k = len(nodes) // groups
    return [tuple(nodes[g * k : (g + 1) * k]) for g in range(groups)]
