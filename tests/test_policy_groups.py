"""policy.groups: what happens to a failed replica group (pure rules, every branch)."""

from __future__ import annotations

import pytest

from ddlaunch.policy import groups as policy
from ddlaunch.policy.groups import GroupState


def two(restarts: int = 0, rejoined: bool = True) -> list[GroupState]:
    return [
        GroupState(0, ("node1",)),
        GroupState(1, ("node2",), restarts=restarts, rejoined=rejoined),
    ]


def decide(groups: list[GroupState], failed: int = 1, **kw: object) -> policy.GroupDecision:
    args: dict[str, object] = {"unusable": set(), "spares": [], "max_restarts": 3, "min_groups": 1}
    args.update(kw)
    return policy.decide(groups[failed], groups, **args)  # type: ignore[arg-type]


def test_a_crash_restarts_the_group_on_its_own_nodes() -> None:
    d = decide(two())
    assert (d.action, d.nodes, d.replaced) == (policy.RESTART, ("node2",), ())
    assert d.reason == "restart group 1 on node2"


def test_a_dead_node_is_replaced_by_a_spare() -> None:
    groups = two()
    spares = policy.free_nodes(["node1", "node2", "node3"], groups, {"node2"})
    assert spares == ["node3"]
    d = decide(groups, unusable={"node2"}, spares=spares)
    assert (d.action, d.nodes) == (policy.RESTART, ("node3",))
    assert d.reason == "restart group 1 on node3 (node2 -> node3)"


def test_no_spare_gives_the_group_up_while_enough_groups_live() -> None:
    d = decide(two(), unusable={"node2"}, spares=[])
    assert d.action == policy.GIVE_UP
    assert d.reason == "group 1 is given up (no spare node left for node2); 1 group(s) go on"


def test_giving_up_below_min_replica_groups_fails_the_job() -> None:
    d = decide(two(), unusable={"node2"}, min_groups=2)
    assert d.action == policy.FAIL_JOB
    assert d.reason == (
        "group 1 cannot restart (no spare node left for node2) and 1 live group(s) are fewer "
        "than fault_tolerance.min_replica_groups (2)"
    )


def test_max_restarts_counts_per_group() -> None:
    assert decide(two(restarts=3)).action == policy.GIVE_UP
    assert decide(two(restarts=2)).action == policy.RESTART
    # The other group's restarts do not count against this one.
    groups = [GroupState(0, ("node1",), restarts=3), GroupState(1, ("node2",))]
    assert decide(groups).action == policy.RESTART


def test_the_progress_guard_gives_up_a_group_that_never_rejoined() -> None:
    d = decide(two(restarts=1, rejoined=False))
    assert d.action == policy.GIVE_UP
    assert "its last restart never rejoined the other groups" in d.reason
    # Its first start failing before it joined is still worth one restart.
    assert decide(two(restarts=0, rejoined=False)).action == policy.RESTART


def test_a_given_up_or_failed_peer_is_not_live() -> None:
    groups = [GroupState(0, ("node1",), given_up=True, running=False), GroupState(1, ("node2",))]
    d = decide(groups, unusable={"node2"})
    assert d.action == policy.FAIL_JOB  # no live group would be left
    # A finished group counts as live: its ranks completed the run.
    done = [GroupState(0, ("node1",), running=False, done=True), GroupState(1, ("node2",))]
    assert decide(done, unusable={"node2"}).action == policy.GIVE_UP


def test_spares_are_the_nodes_no_live_group_holds() -> None:
    groups = [
        GroupState(0, ("n1", "n2")),
        GroupState(1, ("n3", "n4"), given_up=True, running=False),
    ]
    assert policy.free_nodes(["n1", "n2", "n3", "n4", "n5"], groups, {"n5"}) == ["n3", "n4"]


def test_multi_node_groups_replace_only_the_dead_node() -> None:
    groups = [GroupState(0, ("n1", "n2")), GroupState(1, ("n3", "n4"))]
    d = decide(groups, unusable={"n4"}, spares=["n5", "n6"])
    assert d.nodes == ("n3", "n5") and d.replaced == (("n4", "n5"),)


def test_group_nodes_cuts_consecutive_equal_runs() -> None:
    assert policy.group_nodes(["a", "b", "c", "d"], 2) == [("a", "b"), ("c", "d")]
    with pytest.raises(ValueError, match="3 nodes do not split into 2 equal groups"):
        policy.group_nodes(["a", "b", "c"], 2)
