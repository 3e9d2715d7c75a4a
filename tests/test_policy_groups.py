"""policy.groups: what happens to a failed replica group (pure rules, every branch)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddlaunch.policy import groups as policy
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.groups import TRANSITIONS, GroupState, Phase


def two(restarts: int = 0, phase: Phase = Phase.TRAINING) -> list[GroupState]:
    return [
        GroupState(0, ("node1",)),
        GroupState(1, ("node2",), restarts=restarts, phase=phase),
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
    assert d.reason == "group 1 is given up (no spare node left for node2); 1 group goes on"


def test_giving_up_below_min_replica_groups_fails_the_job() -> None:
    d = decide(two(), unusable={"node2"}, min_groups=2)
    assert d.action == policy.FAIL_JOB
    assert d.reason == (
        "group 1 cannot restart (no spare node left for node2) and 1 live group is fewer "
        "than fault_tolerance.min_replica_groups (2)"
    )


def test_max_restarts_counts_per_group() -> None:
    assert decide(two(restarts=3)).action == policy.GIVE_UP
    assert decide(two(restarts=2)).action == policy.RESTART
    # The other group's restarts do not count against this one.
    groups = [GroupState(0, ("node1",), restarts=3), GroupState(1, ("node2",))]
    assert decide(groups).action == policy.RESTART


def test_the_progress_guard_gives_up_a_group_that_never_rejoined() -> None:
    d = decide(two(restarts=1, phase=Phase.HEALING))
    assert d.action == policy.GIVE_UP
    assert "its last restart never rejoined the other groups" in d.reason
    # Its first start failing before it joined is still worth one restart.
    assert decide(two(restarts=0)).action == policy.RESTART
    # A restart that rejoined and failed later is restarted again.
    assert decide(two(restarts=1)).action == policy.RESTART


def test_a_given_up_or_failed_peer_is_not_live() -> None:
    groups = [GroupState(0, ("node1",), phase=Phase.GIVEN_UP), GroupState(1, ("node2",))]
    d = decide(groups, unusable={"node2"})
    assert d.action == policy.FAIL_JOB  # no live group would be left
    # A finished group counts as live: its ranks completed the run.
    done = [GroupState(0, ("node1",), phase=Phase.FINISHED), GroupState(1, ("node2",))]
    assert decide(done, unusable={"node2"}).action == policy.GIVE_UP


def test_spares_are_the_nodes_no_live_group_holds() -> None:
    groups = [
        GroupState(0, ("n1", "n2")),
        GroupState(1, ("n3", "n4"), phase=Phase.GIVEN_UP),
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


# ---------------------------------------------------------------- the hang verdict per group

T = analysis.Thresholds(
    hang_timeout=30, heartbeat_interval=1, straggler_factor=2.0, straggler_patience=30
)  # stale_after: 8 s


def beat(rank: int, host: str, step_wall: float, at: float, **kw: object) -> analysis.Beat:
    return analysis.Beat(
        rank=rank, host=host, step=40, step_wall=step_wall, beat=at, started=0.0, **kw
    )  # type: ignore[arg-type]


def view(group: int, beats: list[analysis.Beat], now: float) -> policy.GroupBeats:
    """A group's heartbeats as the supervisor turns them into the rule's input."""
    last = analysis.last_progress(beats)
    assert last is not None
    frozen = len(analysis.frozen(beats, now, T)) == len(beats)
    return policy.GroupBeats(group, analysis.detect_hang(beats, now, T, len(beats)), last, frozen)


NOW = 1000.0
# Group 0 waits inside torchft for group 1 (its ranks beat, their step stopped with group 1's).
WAITING = [beat(0, "node1", 960.0, 999.5, waiting=True), beat(1, "node1", 960.0, 999.5)]


def test_the_group_with_a_frozen_rank_is_hung_not_the_group_that_waits_for_it() -> None:
    group1 = [
        beat(2, "node2", 960.0, 999.5, waiting=True),
        beat(3, "node2", 960.0, 961.0),  # SIGSTOP: its heartbeat stopped with it
    ]
    verdict = policy.hung_groups([view(0, WAITING, NOW), view(1, group1, NOW)], NOW, T)
    assert verdict.whole_job is None
    ((group, finding),) = verdict.hung
    assert group == 1 and finding.cause == "hang" and finding.nodes == ("node2",)
    assert finding.detail == (
        "no step finished for 40 s (hang_timeout 30 s); rank 3 heartbeat stopped (process frozen)"
    )


def test_a_group_whose_every_rank_froze_is_hung_while_the_others_beat() -> None:
    # A one-node group whose node leader froze: no rank of it differs from another.
    group1 = [beat(2, "node2", 960.0, 961.0), beat(3, "node2", 960.0, 961.0)]
    verdict = policy.hung_groups([view(0, WAITING, NOW), view(1, group1, NOW)], NOW, T)
    ((group, finding),) = verdict.hung
    assert group == 1 and finding.nodes == ()
    assert finding.detail.endswith(
        "no single node to blame; every rank of group 1 stopped beating while the other "
        "groups' ranks beat (its processes are frozen)"
    )


def test_a_stalled_group_is_hung_when_the_others_train_on_without_it() -> None:
    stuck = [beat(2, "node2", 960.0, 999.5, waiting=True), beat(3, "node2", 960.0, 999.5)]
    training = [beat(0, "node1", 998.0, 999.5), beat(1, "node1", 998.0, 999.5)]
    verdict = policy.hung_groups([view(0, training, NOW), view(1, stuck, NOW)], NOW, T)
    assert [g for g, _ in verdict.hung] == [1]


def test_groups_that_stopped_together_without_evidence_wait_then_hang_as_a_job() -> None:
    group0 = [beat(0, "node1", 965.0, 999.5), beat(1, "node1", 965.0, 999.5)]
    group1 = [beat(2, "node2", 965.0, 999.5), beat(3, "node2", 965.0, 999.5)]
    both = [view(0, group0, NOW), view(1, group1, NOW)]
    assert policy.hung_groups(both, NOW, T) == policy.HangVerdict()  # 35 s < 30 + 8
    later = 1000.0 + 15  # 50 s since the last step: a frozen rank would show by now
    group0 = [replace(b, beat=later - 0.5) for b in group0]
    group1 = [replace(b, beat=later - 0.5) for b in group1]
    both = [view(0, group0, later), view(1, group1, later)]
    verdict = policy.hung_groups(both, later, T)
    assert verdict.hung == () and verdict.whole_job is not None
    assert verdict.whole_job.detail == (
        "every replica group (0, 1) stopped: no step finished for 50 s (hang_timeout 30 s); "
        "no single group to blame"
    )
    # A group ended or started 5 s ago: the others may have waited for it; not yet.
    assert policy.hung_groups(both, later, T, changed=later - 5) == policy.HangVerdict()


def test_the_only_group_with_state_is_never_restarted_alone() -> None:
    # Group 1 is healing (not watched): restarting group 0 would leave no group to heal from.
    group0 = [beat(0, "node1", 960.0, 999.5, waiting=True), beat(1, "node1", 960.0, 961.0)]
    verdict = policy.hung_groups([view(0, group0, NOW)], NOW, T)
    assert verdict.hung == () and verdict.whole_job is not None
    assert verdict.whole_job.nodes == ("node1",)
    assert verdict.whole_job.detail.endswith("all of them hang")


def test_a_group_is_not_judged_until_the_timeout_has_passed_since_a_peer_was_ended() -> None:
    # Group 1 was ended for a hang 1.5 s ago and is starting again (not watched). Group 0
    # waited for it inside torchft since step 62; its ranks leave the cross-group collective
    # one by one, so for a moment one looks stuck: evidence that blames node1 wrongly, and
    # with the only group that holds the state "hung", the whole job would be requeued.
    group0 = [beat(0, "node1", 960.0, 999.5, waiting=True), beat(1, "node1", 960.0, 961.0)]
    assert policy.hung_groups([view(0, group0, NOW)], NOW, T, changed=NOW - 1.5) == (
        policy.HangVerdict()
    )
    # Still stalled a whole timeout after the change: it is its own hang.
    later = NOW - 1.5 + T.hang_timeout
    group0 = [replace(b, beat=later - 0.5) if b.rank == 0 else b for b in group0]
    verdict = policy.hung_groups([view(0, group0, later)], later, T, changed=NOW - 1.5)
    assert verdict.whole_job is not None and verdict.whole_job.nodes == ("node1",)


def test_groups_that_step_are_not_hung() -> None:
    fine = [beat(0, "node1", 990.0, 999.5), beat(1, "node1", 990.0, 999.5)]
    assert policy.hung_groups([view(0, fine, NOW)], NOW, T) == policy.HangVerdict()
    assert policy.hung_groups([], NOW, T) == policy.HangVerdict()


def test_a_group_with_no_group_left_to_heal_from_fails_the_job() -> None:
    # Both failed together (the other's step ended too), or the other is restarting itself:
    # a restart would heal from nothing and train on from step 0.
    for other in (
        GroupState(0, ("node1",), phase=Phase.FAILED),
        GroupState(0, ("node1",), restarts=1, phase=Phase.HEALING),
    ):
        d = decide([other, GroupState(1, ("node2",))])
        assert d.action == policy.FAIL_JOB
        assert d.reason == (
            "group 1 cannot restart: no other group trains to heal it from (the job restarts "
            "from its latest checkpoint)"
        )


def test_a_group_failing_after_the_others_finished_is_given_up() -> None:
    d = decide([GroupState(0, ("node1",), phase=Phase.FINISHED), GroupState(1, ("node2",))])
    assert (d.action, d.reason) == (
        policy.GIVE_UP,
        "group 1 is given up: the other groups finished training",
    )


def test_a_finished_group_makes_the_groups_still_healing_too_late() -> None:
    healing = GroupState(1, ("node3",), restarts=1, phase=Phase.HEALING)
    training = GroupState(2, ("node4",))
    done = GroupState(0, ("node1",), phase=Phase.FINISHED)
    assert policy.too_late([done, healing, training]) == [1]
    # Nothing finished yet: the healing group may still rejoin.
    assert policy.too_late([GroupState(0, ("node1",)), healing]) == []
    # A group given up already is not ended twice.
    assert policy.too_late([done, healing.to(Phase.GIVEN_UP)]) == []
    # Nor one whose step failed in the same poll (its failure decides it).
    assert policy.too_late([done, healing.to(Phase.FAILED)]) == []


def test_a_collective_across_groups_outlasts_the_hang_verdict() -> None:
    from ddlaunch.policy.groups import collective_timeout_s
    from ddlaunch.policy.heartbeats import Thresholds

    # hang_timeout 30 s, beats every 1 s: judged hung after 30 + 3 x 1 + 5 = 38 s; the
    # survivors wait in the all-reduce until 68 s, so the hung group is ended first.
    assert collective_timeout_s(Thresholds(30, 1.0, 2.0, 300), watchdog=True) == 68.0
    # The defaults: 600 s + 35 s + 30 s.
    assert collective_timeout_s(Thresholds(600, 10.0, 2.0, 300), watchdog=True) == 665.0
    # No watchdog, no verdict to wait for: a slow peer is an error after the floor.
    assert collective_timeout_s(Thresholds(600, 10.0, 2.0, 300), watchdog=False) == 30.0


def test_every_wait_a_hung_group_prolongs_outlasts_the_hang_verdict() -> None:
    from ddlaunch.policy.groups import ReplicaTimeouts, replica_timeouts
    from ddlaunch.policy.heartbeats import Thresholds

    # hang_timeout 30 s, beats every 1 s: judged hung after 38 s. The commit vote, where a
    # frozen rank's peer's partner waits, is as long as the collective (it was 30 s: the
    # group that only waited failed before the verdict).
    assert replica_timeouts(Thresholds(30, 1.0, 2.0, 300), True, 20) == ReplicaTimeouts(
        collective=68.0, operation=68.0, quorum=68.0
    )
    # The quorum waits heal_timeout when that is longer (a restarted group's first quorum).
    assert replica_timeouts(Thresholds(600, 10.0, 2.0, 300), True, 900).quorum == 900
    # No watchdog: the floor, and heal_timeout for the quorum.
    assert replica_timeouts(Thresholds(600, 10.0, 2.0, 300), False, 600) == ReplicaTimeouts(
        collective=30.0, operation=30.0, quorum=600
    )


# ------------------------------------------------------------ a group's life (its Phase)


def test_a_first_start_trains_and_finishes() -> None:
    g = GroupState(0, ("node1",))
    assert (g.phase, g.running, g.live) == (Phase.TRAINING, True, True)
    done = g.to(Phase.FINISHED)
    assert (done.running, done.live) == (False, True)


def test_a_training_group_fails_then_restarts_healing_on_its_new_nodes() -> None:
    failed = GroupState(0, ("node1",)).to(Phase.FAILED)
    assert (failed.running, failed.live) == (False, False)
    back = failed.restarted(("node3",))
    assert back == GroupState(0, ("node3",), restarts=1, phase=Phase.HEALING)
    assert back.running and back.live


def test_a_failed_group_is_given_up() -> None:
    given_up = GroupState(0, ("node1",)).to(Phase.FAILED).to(Phase.GIVEN_UP)
    assert (given_up.running, given_up.live) == (False, False)


def test_a_healing_group_rejoins_fails_finishes_or_is_given_up() -> None:
    healing = GroupState(0, ("node1",), restarts=1, phase=Phase.HEALING)
    assert healing.to(Phase.TRAINING).phase is Phase.TRAINING  # it rejoined
    assert healing.to(Phase.FAILED).phase is Phase.FAILED  # failed again (or no heal in time)
    assert healing.to(Phase.FINISHED).phase is Phase.FINISHED  # finished before it was seen back
    assert healing.to(Phase.GIVEN_UP).phase is Phase.GIVEN_UP  # a peer finished first


def test_every_move_outside_the_transitions_is_refused() -> None:
    allowed = {
        (Phase.TRAINING, Phase.FAILED),
        (Phase.TRAINING, Phase.FINISHED),
        (Phase.HEALING, Phase.TRAINING),
        (Phase.HEALING, Phase.FAILED),
        (Phase.HEALING, Phase.FINISHED),
        (Phase.HEALING, Phase.GIVEN_UP),
        (Phase.FAILED, Phase.HEALING),
        (Phase.FAILED, Phase.GIVEN_UP),
    }
    assert {(a, b) for a, moves in TRANSITIONS.items() for b in moves} == allowed
    for a in Phase:
        for b in Phase:
            g = GroupState(0, ("node1",), restarts=1, phase=a)
            if (a, b) in allowed:
                assert g.to(b).phase is b
            else:
                with pytest.raises(ValueError, match=f"no move from {a.value} to {b.value}"):
                    g.to(b)
    # Finished and given up are final; a training group is never restarted without failing.
    with pytest.raises(ValueError):
        GroupState(0, ("node1",)).restarted(("node2",))
