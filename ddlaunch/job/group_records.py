"""What the replica groups' supervisor (``job.groups``) writes down, best effort (a failed
write never stops the groups: the batch log has the line): its lines in the batch log
(``say``), each group restart in the open attempt's record (``store.group_restarts``: the
entry when the group failed, its rejoin, its end before a rejoin), the groups' view for
``status`` (``groups/state.json``), the nodes it leaves out (the run's exclusions and the
user's bad-node list), and the whole job's hang verdict for the end hook."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ddlaunch.policy.groups import GroupState, Phase
from ddlaunch.policy.heartbeats import Finding
from ddlaunch.store import attempts, exclusions, group_state
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.group_restarts import GroupRestart

# The newest entries an attempt keeps: a group failing in a loop cannot grow its record
# without bound.
KEPT_RESTARTS = 100
# A group's phase as ``status`` shows it: a failed group is being restarted or given up.
VIEWS = {
    Phase.TRAINING: group_state.TRAINING,
    Phase.HEALING: group_state.HEALING,
    Phase.FAILED: group_state.HEALING,
    Phase.FINISHED: group_state.FINISHED,
    Phase.GIVEN_UP: group_state.GIVEN_UP,
}


def say(line: str) -> None:
    print(f"[ddlaunch groups] {line}", flush=True)


def record_restart(run_dir: Path, entry: GroupRestart) -> None:
    """Append one group restart to the open attempt's record."""
    try:
        found = attempts.load(run_dir)
        before = list(found[-1].group_restarts or ()) if found else []
        kept = [*before[-(KEPT_RESTARTS - 1) :], entry]
        attempts.update_open(run_dir, group_restarts=[e.to_json() for e in kept])
    except Exception as exc:
        say(f"warning: group restart not recorded: {exc!r}")


def record_rejoin(
    run_dir: Path,
    group: int,
    restart: int,
    step: int,
    healed: bool,
    after: float,
    source: int | None = None,
) -> None:
    """Add the heal to the group's restart entry (``restart``: the entry's count;
    ``source``: the group it healed from, where known)."""

    def change(entry: GroupRestart) -> GroupRestart:
        return entry.rejoined(step, healed, after, source)

    update_restart(run_dir, group, restart, change, "the rejoin")


def record_too_late(run_dir: Path, group: int, restart: int, why: str) -> None:
    """Say on the group's restart entry that it was ended before it rejoined, and why."""
    update_restart(run_dir, group, restart, lambda e: e.ended_early(why), "the group's end")


def update_restart(
    run_dir: Path,
    group: int,
    restart: int,
    change: Callable[[GroupRestart], GroupRestart],
    what: str,
) -> None:
    """Rewrite the open attempt's newest entry of ``group`` number ``restart`` with
    ``change``."""
    try:
        found = attempts.load(run_dir)
        entries = list(found[-1].group_restarts or ()) if found else []
        for i in reversed(range(len(entries))):
            if entries[i].group == group and entries[i].restart == restart:
                entries[i] = change(entries[i])
                break
        attempts.update_open(run_dir, group_restarts=[e.to_json() for e in entries])
    except Exception as exc:
        say(f"warning: {what} was not recorded: {exc!r}")


def publish(run_dir: Path, attempt: AttemptId, now: float, groups: Sequence[GroupState]) -> None:
    """``groups/state.json`` for ``status``."""
    views = tuple(
        group_state.GroupView(g.group, g.nodes, VIEWS[g.phase], g.restarts) for g in groups
    )
    a = attempt
    snapshot = group_state.GroupsState(a.job_id, a.restart, a.relaunch, now, views)
    try:
        group_state.write_state(run_dir, snapshot)
    except OSError as exc:
        say(f"warning: groups/state.json not written: {exc}")


def leave_out(run_dir: Path, nodes: Sequence[str], why: str, bad_node_ttl_hours: float) -> None:
    """Keep ``nodes`` out of this run (its exclusions) and, for ``bad_node_ttl_hours``, out
    of the user's other runs (the bad-node list: the user's, so best effort)."""
    exclusions.leave_out(run_dir, nodes, why, bad_node_ttl_hours)


def record_job_hang(run_dir: Path, attempt: AttemptId, finding: Finding, now: float) -> None:
    """The watchdog's verdict record of a hang of every group: the end hook concludes the
    attempt as a hang."""
    watchdog_records.write_verdict(
        run_dir,
        attempt,
        watchdog_records.Verdict(
            cause=finding.cause,
            nodes=tuple(finding.nodes),
            ranks=tuple(finding.ranks),
            detail=finding.detail,
            time=now,
            job_id=attempt.job_id,
            restart=attempt.restart,
        ),
    )
