"""The replica groups' health watch (batch host, torch-free), for the supervisor
(``job.groups``): it reads what the groups leave behind and returns verdicts; it never ends
a step itself (the supervisor does, on a verdict).

* ``look``, per running group each poll: a task of its step ended (srun's report in the
  group's srun log: the rest must be killed now), it rejoined the others after a restart
  (its heal record or a committed step since its start), it did not within
  ``fault_tolerance.heal_timeout``, or a node of it died (the node-death check of
  ``job.blame``, every second on a small job, on a trigger on a big one: failure records
  left without srun returning, or its nodes' heartbeats gone quiet);
* ``health``, once a watchdog poll period: the heartbeats of every group not given up,
  summarised into the watchdog's records for ``status`` and ``report``, the hang verdict
  per group (``policy.groups.hung_groups``) and the straggler rule over the watched groups'
  nodes (``policy.heartbeats.detect_straggler``);
* ``attribution``: the culprit and ranked causes of a group's failure (srun's reports and
  the failure records of its ranks, job-wide rank numbers).
"""

from __future__ import annotations

import bisect
import contextlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddlaunch.job.blame import dead_nodes
from ddlaunch.job.group_records import say
from ddlaunch.job.group_steps import Group
from ddlaunch.job.watchdog import poll_period
from ddlaunch.policy import attribution as attrib
from ddlaunch.policy import groups as policy
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.groups import Phase, StepEnd
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import groups, heartbeats
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import Failure, read_failures

# A group whose ranks left failure records but whose srun has not returned this long after:
# srun waits for a task on a node that no longer answers; probe its nodes.
GRACE_S = 2.0
PROBE_EVERY_S = 1.0
PROBE_ALWAYS_NODES = 64
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Rejoin:
    """A restarted group back in the quorum: at ``step``, healed from group ``source``
    (None: not known) or, ``healed`` False, with no heal needed; ``after``: seconds since
    its restart."""

    step: int
    healed: bool
    source: int | None
    after: float


@dataclass(frozen=True)
class Look:
    """What one look at a running group found: ``kill_rest``: a task of its step ended;
    ``rejoin``: it rejoined; ``end``: its step must end."""

    kill_rest: bool = False
    rejoin: Rejoin | None = None
    end: StepEnd | None = None


@dataclass(frozen=True)
class Health:
    """What one read of the heartbeats says: ``whole_job``: every group hangs (the job's
    failure); ``hung``: the groups to end and restart, each with its verdict;
    ``straggler``: a slow node among ``watched`` (the groups judged)."""

    whole_job: analysis.Finding | None = None
    hung: tuple[tuple[Group, StepEnd], ...] = ()
    straggler: analysis.Finding | None = None
    watched: tuple[Group, ...] = ()


@dataclass
class GroupWatch:
    """The watch (the module's doc). ``thresholds``: the health limits; ``hangs``: the hang
    and straggler rules on (``health.watchdog``); ``probe_always``: a small job, whose nodes
    are checked every ``PROBE_EVERY_S`` whatever the trigger."""

    run_dir: Path
    attempt: AttemptId
    client: SlurmClient
    ranks_per_node: int
    thresholds: analysis.Thresholds
    hangs: bool
    heal_timeout: float
    probe_always: bool
    last_check: float = float("-inf")  # the last read of the heartbeats
    last_sample: int | None = None  # the step of the last step-history sample
    stragglers: analysis.StragglerState = field(default_factory=analysis.StragglerState)

    def size(self, g: Group) -> int:
        return len(g.state.nodes) * self.ranks_per_node

    # ------------------------------------------------------------------ per group

    def look(self, g: Group, now: float, found: list[Failure]) -> Look:
        """One look at the running group ``g`` (``found``: the run's failure records, read
        once per poll for every group)."""
        step = g.step
        assert step is not None
        if not step.killing and self.step_log(g).ends:
            return Look(kill_rest=True)
        back = None
        if g.state.phase is Phase.HEALING:
            back = self.rejoin(g, now)
            if back is None and now - step.started > self.heal_timeout:
                why = (
                    f"it did not rejoin the others within fault_tolerance."
                    f"heal_timeout ({self.heal_timeout:.0f} s)"
                )
                return Look(end=StepEnd(why))
        failed = self.failures(g, found)
        stale = failed and now - min(f.time for f in failed) >= GRACE_S
        # A small job's nodes are probed every second whatever the trigger (a node dying with
        # all of a group's ranks leaves no record, and heartbeats are seconds apart); a big
        # one's only on a trigger (2,000 connects a second would load the batch host).
        trigger = self.probe_always or stale or self.silent(g, now)
        if trigger and now - step.last_probe >= PROBE_EVERY_S:
            step.last_probe = now
            dead = tuple(dead_nodes(self.client, g.state.nodes, PROBE_TIMEOUT_S))
            if dead:
                return Look(rejoin=back, end=StepEnd(f"node {', '.join(dead)} died", dead=dead))
        return Look(rejoin=back)

    def failures(self, g: Group, found: list[Failure] | None = None) -> list[attrib.Raised]:
        """This group's ranks' failure records since its (re)start."""
        assert g.step is not None
        last = g.rank_offset + self.size(g)
        names = {self.attempt.job_id, self.attempt.task}
        return [
            attrib.Raised(f.rank, f.host, f.exception, f.message, f.where, f.time)
            for f in (read_failures(self.run_dir) if found is None else found)
            if g.rank_offset <= f.rank < last
            and str(f.job_id) in names
            and f.time >= g.step.started - 1.0
        ]

    def step_log(self, g: Group) -> attrib.StepLog:
        """What srun reported of the group's current step (its log since the step's start);
        the step's own rank numbers."""
        step = g.step
        if step is not None:
            with contextlib.suppress(OSError), open(step.srun_log, errors="replace") as log:
                if os.fstat(log.fileno()).st_size > step.log_offset:
                    log.seek(step.log_offset)
                    return attrib.parse_step_lines(log)
        return attrib.StepLog()

    def rejoin(self, g: Group, now: float) -> Rejoin | None:
        """The restarted group back in the quorum: its heal record, or (a group that needed
        no heal) a committed step, written since this start."""
        st, step = g.state, g.step
        assert step is not None
        after = now - step.started
        heal = groups.read_heal(self.run_dir, st.group, st.restarts)
        if heal is not None and heal.healed_at >= step.started - 1.0:
            return Rejoin(heal.healed_from_step, True, heal.healed_from_group, after)
        found = groups.read_step(self.run_dir, st.group)
        if found is not None and found.restart == st.restarts and found.time >= step.started - 1:
            return Rejoin(found.step, False, None, after)
        return None

    def silent(self, g: Group, now: float) -> bool:
        """The group's nodes wrote no heartbeat for a while although its step runs: a node
        that vanished without closing its connections (its ranks cannot say so)."""
        assert g.step is not None
        beat = heartbeats.last_node_beat(self.run_dir, g.state.nodes)
        stale = self.thresholds.stale_after
        return beat is not None and beat >= g.step.started - 1.0 and now - beat > stale

    def last_step(self, g: Group) -> int | None:
        """The newest step the group's ranks reported in their heartbeats."""
        last = g.rank_offset + self.size(g)
        steps = [
            step
            for r in heartbeats.read_heartbeats(self.run_dir)
            if isinstance(step := r.get("step"), int)
            and g.rank_offset <= int(r.get("rank", -1)) < last
            and r.get("job_id") == self.attempt.job_id
        ]
        return max(steps) if steps else None

    def attribution(self, g: Group) -> tuple[str, list[dict[str, object]]]:
        """(culprit, causes) of the group's failure, job-wide rank numbers."""
        step = self.step_log(g)
        ends = tuple(replace(e, rank=e.rank + g.rank_offset) for e in step.ends)
        causes = attrib.rank_causes(replace(step, ends=ends), self.failures(g))
        ended = g.step.end if g.step is not None else None
        culprit = causes[0].text if causes else (ended.why if ended else "")
        return culprit, [c.as_dict() for c in causes[:10]]

    # ------------------------------------------------------------------ every group

    def due(self, now: float) -> bool:
        """Whether a read of the heartbeats is due (once a watchdog poll period)."""
        return self.hangs and now - self.last_check >= poll_period(self.thresholds)

    def health(self, all_groups: list[Group], now: float, changed: float) -> Health:
        """The hang verdict per group and the straggler rule, over the groups that train
        (a restarted group that has not rejoined answers to ``heal_timeout`` instead);
        ``changed``: when a group was last started or ended (``hung_groups``)."""
        self.last_check = now
        per_group = self.record_beats(all_groups, now)
        t = self.thresholds
        trains = [
            g for g in all_groups if g.state.phase is Phase.TRAINING and g.step and not g.ending
        ]
        if not trains:
            return Health()
        views: list[policy.GroupBeats] = []
        by_group: dict[int, Group] = {}
        for g in trains:
            mine = per_group.get(g.state.group, [])
            last = analysis.last_progress(mine)
            if last is None:  # no heartbeat from this start yet: nothing to judge
                continue
            running = [b for b in mine if b.state == "running"]
            views.append(
                policy.GroupBeats(
                    g.state.group,
                    analysis.detect_hang(mine, now, t, self.size(g)),
                    last,
                    len(analysis.frozen(running, now, t)) == len(running),
                )
            )
            by_group[g.state.group] = g
        verdict = policy.hung_groups(views, now, t, changed)
        if verdict.whole_job is not None:
            return Health(whole_job=verdict.whole_job)
        if verdict.hung:
            hung = tuple(
                (by_group[group], StepEnd(f"hang: {f.detail}", f.cause, f.detail, f.nodes))
                for group, f in verdict.hung
            )
            return Health(hung=hung)
        watched = tuple(by_group.values())
        beats = [b for g in watched for b in per_group.get(g.state.group, [])]
        finding = analysis.detect_straggler(beats, now, t, self.stragglers)
        return Health(straggler=finding, watched=watched)

    def group_beats(
        self, all_groups: list[Group], beats: list[analysis.Beat]
    ) -> dict[int, list[analysis.Beat]]:
        """Group -> its ranks' beats since its current start (a restarted group's old ranks
        may have left their records behind, on a node it left for a spare), for the groups
        not given up. One pass over the beats, each placed by its rank (O(n log groups))."""
        live = sorted(
            (g for g in all_groups if g.state.phase is not Phase.GIVEN_UP and g.step),
            key=lambda g: g.rank_offset,
        )
        offsets = [g.rank_offset for g in live]
        out: dict[int, list[analysis.Beat]] = {g.state.group: [] for g in live}
        for b in beats:
            i = bisect.bisect_right(offsets, b.rank) - 1
            if i < 0:
                continue
            g = live[i]
            assert g.step is not None
            if b.rank < g.rank_offset + self.size(g) and b.started >= g.step.started - 1.0:
                out[g.state.group].append(b)
        return out

    def record_beats(self, all_groups: list[Group], now: float) -> dict[int, list[analysis.Beat]]:
        """The heartbeats of each group that is not given up, from its current start (one
        read for every group), summarised into ``health/watchdog.json`` and, when the step
        advanced, the step history (``health/steps.jsonl``): the watchdog's records, which
        ``status`` and ``report`` read. Best effort: a failed write never stops the groups."""
        a = self.attempt
        records = heartbeats.read_heartbeats(self.run_dir)
        beats = analysis.current_beats(records, a.job_id, a.restart, 0.0, a.relaunch)
        per_group = self.group_beats(all_groups, beats)
        current = sorted((b for mine in per_group.values() for b in mine), key=lambda b: b.rank)
        if not current:
            return per_group
        ids = {"job_id": a.job_id, "restart": a.restart, "relaunch": a.relaunch}
        summary = watchdog_records.Summary.from_json({**analysis.summary(current, now), **ids})
        try:
            watchdog_records.write_summary(self.run_dir, summary)
            if summary.step is not None and summary.step != self.last_sample:
                self.last_sample = summary.step
                watchdog_records.append_sample(self.run_dir, summary)
        except OSError as exc:
            say(f"warning: the step history was not written: {exc}")
        return per_group
