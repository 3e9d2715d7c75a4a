"""The replica groups' supervisor (batch host, torch-free): ``python -m ddlaunch.job.groups``.

With ``fault_tolerance.mode: replica_groups`` the batch script runs this in place of its one
srun step. It starts the torchft lighthouse on the batch host (without torch:
``ddlaunch.job.lighthouse``), then one srun step per replica group on that group's nodes
(each its own torch.distributed world; the groups meet per step through the lighthouse and
torchft's Manager), and watches them:

* a group whose step fails (a rank crashed or was killed: srun reports the task's end and
  the supervisor kills the step's other tasks at once, srun's own --kill-on-bad-exit being
  off for group steps; a node that died: found as the watchdog finds one, and its step ended
  at once) is restarted **alone**, on its own nodes or with a hot spare in place of a dead
  one (``policy.groups`` decides), while the other groups' steps keep running; the restarted
  group heals from a live group (torchft's checkpoint transport) and rejoins;
* a group that hangs (its ranks' heartbeats show no finished step for ``health.hang_timeout``:
  the watchdog's rule, ``policy.heartbeats.detect_hang``, on the group's own ranks) is ended
  and restarted alone like a crash, cause ``hang``; ``policy.groups.hung_groups`` tells the
  hung group from the others, which a hung group stalls too;
* a node that straggles (the watchdog's straggler rule over every watched group's nodes) has
  its group restarted with a hot spare in its place, cause ``straggler``; without a spare (or
  a restart the rules would refuse) it is said once and the group trains on;
* a restarted group that has not rejoined within ``fault_tolerance.heal_timeout`` is ended
  and counts as failed again (the progress guard then gives it up);
* a group that finishes training ends the restarted groups not yet rejoined, given up and
  not failed (``policy.groups.too_late``): nothing is left to heal them from;
* ending a group's step cancels the step itself (``scancel --signal=KILL JOB.STEP``, the step
  found by its name, ``ddlaunch-group-<g>-<restart>``): killing srun alone would leave the
  step's tasks running on the group's other nodes; then srun is waited for, and the step's
  leaving the queue, before the group restarts;
* each group restart goes into the attempt's record (``group_restarts``: group, cause,
  culprit as attribution finds it, old and new nodes, when);
* fewer live groups than ``min_replica_groups``, or the lighthouse gone, is a failure of the
  whole job: every group's step is ended and this exits nonzero, so the end hook concludes
  the attempt as today (restart in the allocation, or requeue from the latest complete
  checkpoint). Every group finished: exit 0.

Why a Python supervisor and not bash: it waits on several steps at once, reads the failure
records and srun's reports of one group, and keeps per-group counts; bash's ``wait -n``
cannot tell which step ended without racing.

The parts of replica groups, by where they run (this is their index): ``config.replica_rules``
(the rules), ``planning.group_env`` (each group's environment), this module and
``policy.groups`` (the supervisor and its decisions), ``store.groups`` (the groups' records),
``worker.replica``, ``worker.step_manager`` and ``worker.heal_source`` (torchft's Manager in
the ranks), ``app.report_groups`` (their restarts in ``report``), ``policy.replica_sim`` (the
goodput model).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddlaunch.job.blame import bad_nodes, expand, probe_all
from ddlaunch.job.placement import allocation, step_nodelist
from ddlaunch.job.watchdog import poll_period
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.ports import master_port_for
from ddlaunch.policy import attribution as attrib
from ddlaunch.policy import groups as policy
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.groups import GroupState
from ddlaunch.slurm.client import SlurmClient, scancel_argv
from ddlaunch.slurm.parse import het_group_of
from ddlaunch.store import attempts, badnodes, exclusions, group_state, groups, heartbeats
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import Failure, read_failures
from ddlaunch.store.rundir import LOGS_DIR

# Where the worker's argv starts in this module's command line (after srun's argv).
WORKER_MARK = "--ddlaunch-worker"
POLL_S = 0.2
# A group whose ranks left failure records but whose srun has not returned this long after:
# srun waits for a task on a node that no longer answers; probe its nodes.
GRACE_S = 2.0
PROBE_EVERY_S = 1.0
PROBE_ALWAYS_NODES = 64
# How long the lighthouse may take to listen while its process lives. It starts in 0.12-0.16 s
# (ddlaunch.job.lighthouse: no torch); the margin is for a batch host whose cores are busy,
# where a start-up is many times slower and not a failure.
LIGHTHOUSE_UP_S = 60.0
# torchft's lighthouse without torch, run by this interpreter (the one that has ddlaunch and,
# with its ft extra, torchft).
LIGHTHOUSE_SCRIPT = Path(__file__).with_name("lighthouse.py")
# Survivors drop a dead group from the quorum after this long without its manager's
# heartbeat (torchft's default is 5000 ms): the survivors' stall per failure is about this
# plus a step. The managers beat every 100 ms from torchft's native server threads, which
# hold no GIL, so five missed beats in a row mean a dead group, not a busy one; a live group
# dropped all the same only misses a step (it joins the next quorum).
HEARTBEAT_TIMEOUT_MS = 500
QUORUM_TICK_MS = 100
# How long the lighthouse waits, at the first quorum, for groups still starting.
JOIN_TIMEOUT_MS = 10000
WHOLE_JOB_FAILED = 1
# Ending a group's step: how long scancel may take before srun is killed anyway (it waits
# MessageTimeout for a dead node's slurmd, while the live nodes have the signal at once),
# how long srun may take to return after it, and how long the step may take to leave the
# queue (its tasks killed on every node) before the group restarts regardless.
CANCEL_WAIT_S = 2.0
SRUN_WAIT_S = 5.0
STEP_GONE_S = 10.0
STEP_GONE_POLL_S = 0.5
# The least time between two lookups of the groups' step ids, and after a group's start.
STEP_LOOKUP_S = 1.0
STEP_NAME = "ddlaunch-group-{group}-{restart}"
CANCEL_SIGNAL = "KILL"


def step_name(group: int, restart: int) -> str:
    """The name of a group's srun step (``--job-name`` of a step): how the supervisor finds
    the step's id in ``squeue -s`` to cancel it."""
    return STEP_NAME.format(group=group, restart=restart)


@dataclass
class Group:
    """One group's step as the supervisor runs it."""

    state: GroupState
    rank_offset: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    srun_log: Path | None = None
    log_offset: int = 0
    last_probe: float = float("-inf")
    dead: tuple[str, ...] = ()
    ended_why: str = ""  # why the supervisor ended the step itself (dead node, no heal, hang)
    cause: str = ""  # the recorded cause where it is a verdict's (``hang``)
    detail: str = ""  # the verdict's detail: the culprit of the record
    blamed: tuple[str, ...] = ()  # the nodes the verdict names
    avoid: tuple[str, ...] = ()  # nodes the restart must leave out (a straggler)
    killing: bool = False  # a task of the step ended: the rest were sent SIGKILL
    step_ids: tuple[str, ...] = ()  # the current step's Slurm ids, once looked up
    end_seen: float = 0.0  # when srun's report of a task's end was first seen
    rest_killed: float = 0.0  # when the scancel of the other tasks returned


@dataclass
class Settings:
    groups: int
    ranks_per_node: int
    min_groups: int
    max_restarts: int
    heal_timeout: float
    stale_after: float
    bad_node_ttl_hours: float
    srun: tuple[str, ...]
    worker: tuple[str, ...]
    hang_timeout: float = 0.0  # health.hang_timeout; 0: no verdicts (health.watchdog off)
    heartbeat_interval: float = 10.0
    straggler_factor: float = math.inf  # health.straggler_factor; inf: no straggler verdict
    straggler_patience: float = 300.0

    @property
    def thresholds(self) -> analysis.Thresholds:
        return analysis.Thresholds(
            self.hang_timeout, self.heartbeat_interval, self.straggler_factor,
            self.straggler_patience,
        )  # fmt: skip


@dataclass
class Supervisor:
    settings: Settings
    run_dir: Path
    attempt: AttemptId
    allocation: list[str]
    client: SlurmClient
    env: Mapping[str, str]
    groups: list[Group] = field(default_factory=list)
    lighthouse_addr: str = ""
    clock: Callable[[], float] = time.time
    stopping: bool = False
    last_hang_check: float = float("-inf")
    changed: float = 0.0  # when a group was last started or ended (hung_groups' ``changed``)
    last_sample: int | None = None  # the step of the last step-history sample
    stragglers: analysis.StragglerState = field(default_factory=analysis.StragglerState)
    said_slow: set[str] = field(default_factory=set)  # stragglers said, left training
    last_step_lookup: float = float("-inf")

    # ------------------------------------------------------------------ start

    def start_group(self, g: Group) -> None:
        s = self.settings
        nodes = g.state.nodes
        k = len(nodes)
        restart = g.state.restarts
        ident = GroupIdentity(g.state.group, s.groups, self.lighthouse_addr, g.rank_offset, restart)
        job = self.attempt.task or self.attempt.job_id or "job"
        port = master_port_for(
            f"{job}.group{g.state.group}.{restart}", self.attempt.restart, self.attempt.relaunch
        )
        env = dict(self.env)
        # The manager's port is the OS's choice (0): the group's other ranks read its
        # address from the group's store and the lighthouse from its registration, so no
        # one needs it beforehand. A port derived from the job, as the master port must be,
        # can be taken on a busy node (it lies in the ephemeral range): a group that could
        # not bind it failed at its start with "Address already in use".
        env.update(ident.env(manager_port=0))
        env["DDLAUNCH_MASTER_PORT"] = str(port)
        env["DDLAUNCH_STEP_NODELIST"] = ",".join(nodes)
        env["DDLAUNCH_WORLD_SIZE"] = str(k * s.ranks_per_node)
        logs = self.run_dir / LOGS_DIR
        logs.mkdir(parents=True, exist_ok=True)
        g.srun_log = logs / f"group-{g.state.group}.srun"
        with contextlib.suppress(OSError):
            g.log_offset = g.srun_log.stat().st_size
        argv = [
            *group_srun(s.srun, logs, g.state.group, het_group_of(self.env, nodes[0])),
            f"--job-name={step_name(g.state.group, restart)}",
            "--overlap",
            f"--nodes={k}",
            f"--ntasks={k * s.ranks_per_node}",
            f"--nodelist={','.join(nodes)}",
            *s.worker,
        ]
        with open(g.srun_log, "ab") as err:  # srun keeps its own copy of the descriptor
            g.proc = subprocess.Popen(argv, env=env, stderr=err, start_new_session=False)
        g.started = self.changed = self.clock()
        g.dead, g.ended_why, g.cause, g.detail, g.blamed, g.avoid = (), "", "", "", (), ()
        g.killing, g.step_ids, g.end_seen, g.rest_killed = False, (), 0.0, 0.0
        g.state = replace(g.state, running=True, rejoined=restart == 0)
        self.publish()
        say(
            f"group {g.state.group}: started on {','.join(nodes)} (ranks {g.rank_offset}-"
            f"{g.rank_offset + k * s.ranks_per_node - 1}, restart {restart})"
        )

    def publish(self) -> None:
        """``groups/state.json`` for ``status`` (best effort: never stops the groups)."""
        views = []
        for g in self.groups:
            st = g.state
            state = (
                group_state.GIVEN_UP
                if st.given_up
                else group_state.FINISHED
                if st.done
                else group_state.TRAINING
                if st.rejoined
                else group_state.HEALING
            )
            views.append(group_state.GroupView(st.group, st.nodes, state, st.restarts))
        a = self.attempt
        snapshot = group_state.GroupsState(
            a.job_id, a.restart, a.relaunch, self.clock(), tuple(views)
        )
        try:
            group_state.write_state(self.run_dir, snapshot)
        except OSError as exc:
            say(f"warning: groups/state.json not written: {exc}")

    # ------------------------------------------------------------------ watch

    def group_failures(self, g: Group, found: list[Failure] | None = None) -> list[attrib.Raised]:
        """This group's ranks' failure records since its (re)start; ``found``: the run's
        records, read once per poll for every group."""
        last = g.rank_offset + len(g.state.nodes) * self.settings.ranks_per_node
        names = {self.attempt.job_id, self.attempt.task}
        return [
            attrib.Raised(f.rank, f.host, f.exception, f.message, f.where, f.time)
            for f in (read_failures(self.run_dir) if found is None else found)
            if g.rank_offset <= f.rank < last
            and str(f.job_id) in names
            and f.time >= g.started - 1.0
        ]

    def dead_nodes(self, g: Group) -> list[str]:
        """The group's nodes Slurm reports bad or whose slurmd does not answer."""
        nodes = list(g.state.nodes)
        try:
            bad = set(bad_nodes(self.client.node_states(nodes)))
        except Exception:
            bad = set()
        port = self.client.slurmd_port()
        rest = [n for n in nodes if n not in bad]
        if port and rest:
            known = self.client.node_addresses(rest)
            addresses = [known.get(n) or n for n in rest]
            for node, up in zip(rest, probe_all(addresses, port, timeout=1.0), strict=True):
                if not up:
                    bad.add(node)
        return sorted(bad)

    def step_log(self, g: Group) -> attrib.StepLog:
        """What srun reported of the group's current step (its log since the group's start);
        the step's own rank numbers."""
        if g.srun_log is not None:
            with contextlib.suppress(OSError), open(g.srun_log, errors="replace") as log:
                if os.fstat(log.fileno()).st_size > g.log_offset:
                    log.seek(g.log_offset)
                    return attrib.parse_step_lines(log)
        return attrib.StepLog()

    def task_ended(self, g: Group) -> bool:
        """Whether srun reported a task of the group's current step ended (exit or kill)."""
        return bool(self.step_log(g).ends)

    def kill_the_rest(self, g: Group) -> None:
        """A task of the group's step ended: SIGKILL the others now. srun's own end of the
        step (--kill-on-bad-exit, off for group steps: ``group_srun``) would send TERM,
        which a rank takes as a stop request, and KILL only after Slurm's KillWait (30 s by
        default, 5 s on the dev cluster): until then the group's torchft manager lives on in
        its other ranks, and the other groups' quorum waits for it (seen: the survivors
        stalled 5.4 s on one rank's kill). One Slurm call when the step's id is known
        already (``learn_step_ids``)."""
        g.killing = True
        g.end_seen = self.clock()
        say(f"group {g.state.group}: a task of its step ended; killing the others now")
        threading.Thread(target=self.kill_rest_now, args=(g,), daemon=True).start()

    def kill_rest_now(self, g: Group) -> None:
        self.cancel_step(g, [])
        g.rest_killed = self.clock()

    def learn_step_ids(self, now: float) -> None:
        """Look up the Slurm ids of the running groups' steps that lack one, in one ``squeue``
        for all of them, at most once a ``STEP_LOOKUP_S``: a failed group's other tasks are
        then killed with one Slurm call, not two (every second counts: the other groups'
        quorum waits for the failed group's manager until its ranks are gone)."""
        wanted = [g for g in self.groups if g.state.running and not g.step_ids]
        if not wanted or not self.attempt.job_id:
            return
        if now - self.last_step_lookup < STEP_LOOKUP_S:
            return
        if all(now - g.started < STEP_LOOKUP_S for g in wanted):
            return  # srun has not made the steps yet
        self.last_step_lookup = now
        try:
            steps = self.client.steps_by_name(self.attempt.job_id)
        except Exception:
            return  # a later poll tries again; a kill looks the id up itself
        for g in wanted:
            g.step_ids = tuple(steps.get(step_name(g.state.group, g.state.restarts), ()))

    def watch_running(self, g: Group, now: float, found: list[Failure]) -> None:
        """A running group whose node died, or that never healed: end its step now; one
        whose task ended: kill its other ranks at once."""
        assert g.proc is not None
        if not g.killing and self.task_ended(g):
            self.kill_the_rest(g)
            return
        if not g.state.rejoined:
            back = self.rejoin(g)
            if back is not None:
                g.state = replace(g.state, rejoined=True)
                step, heal, source = back
                after = now - g.started
                peer = "a live group" if source is None else f"group {source}"
                how = f"healed from {peer} at step {step}" if heal else f"at step {step}"
                say(
                    f"group {g.state.group}: rejoined the others ({how}) "
                    f"{after:.1f} s after its restart"
                )
                record_rejoin(
                    self.run_dir, g.state.group, g.state.restarts - 1, step, heal, after, source
                )
                self.publish()
            elif now - g.started > self.settings.heal_timeout:
                g.ended_why = (
                    f"it did not rejoin the others within fault_tolerance."
                    f"heal_timeout ({self.settings.heal_timeout:.0f} s)"
                )
                self.end_step(g)
                return
        failed = self.group_failures(g, found)
        stale = failed and now - min(f.time for f in failed) >= GRACE_S
        # A small job's nodes are probed every second whatever the trigger (a node dying with
        # all of a group's ranks leaves no record, and heartbeats are seconds apart); a big
        # one's only on a trigger (2,000 connects a second would load the batch host).
        small = len(self.allocation) <= PROBE_ALWAYS_NODES
        if (small or stale or self.silent(g, now)) and now - g.last_probe >= PROBE_EVERY_S:
            g.last_probe = now
            dead = self.dead_nodes(g)
            if dead:
                g.dead = tuple(dead)
                g.ended_why = f"node {', '.join(dead)} died"
                self.end_step(g)

    def rejoin(self, g: Group) -> tuple[int, bool, int | None] | None:
        """(step, healed, the group it healed from) once the restarted group is back in the
        quorum: its heal record, or (a group that needed no heal) a committed step, written
        since this start."""
        st = g.state
        heal = groups.read_heal(self.run_dir, st.group, st.restarts)
        if heal is not None and heal.healed_at >= g.started - 1.0:
            return heal.healed_from_step, True, heal.healed_from_group
        step = groups.read_step(self.run_dir, st.group)
        if step is not None and step.restart == st.restarts and step.time >= g.started - 1.0:
            return step.step, False, None
        return None

    def silent(self, g: Group, now: float) -> bool:
        """The group's nodes wrote no heartbeat for a while although its step runs: a node
        that vanished without closing its connections (its ranks cannot say so)."""
        beat = heartbeats.last_node_beat(self.run_dir, g.state.nodes)
        stale = self.settings.stale_after
        return beat is not None and beat >= g.started - 1.0 and now - beat > stale

    def last_step(self, g: Group) -> int | None:
        """The newest step the group's ranks reported in their heartbeats."""
        last = g.rank_offset + len(g.state.nodes) * self.settings.ranks_per_node
        steps = [
            step
            for r in heartbeats.read_heartbeats(self.run_dir)
            if isinstance(step := r.get("step"), int)
            and g.rank_offset <= int(r.get("rank", -1)) < last
            and r.get("job_id") == self.attempt.job_id
        ]
        return max(steps) if steps else None

    def end_step(self, g: Group) -> None:
        """End the group's step: cancel it through Slurm (every node's tasks; killing srun
        alone leaves them running on the nodes still up), then wait for srun (killed if it
        does not return) and for the step to leave the queue; the caller's next poll sees
        srun's exit and restarts the group (``on_failure``)."""
        say(f"group {g.state.group}: ending its step: {g.ended_why}")
        self.changed = self.clock()
        ids: list[str] = []
        # Aside: scancel waits for a dead node's slurmd (MessageTimeout) while the live nodes
        # have the signal at once; srun must not wait that long.
        cancel = threading.Thread(target=self.cancel_step, args=(g, ids), daemon=True)
        cancel.start()
        cancel.join(CANCEL_WAIT_S)
        if g.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                g.proc.wait(timeout=SRUN_WAIT_S if not g.dead else 0.1)
            if g.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    g.proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    g.proc.wait(timeout=SRUN_WAIT_S)
        if ids and not g.dead:  # a dead node's step stays in the queue until Slurm says so
            self.wait_step_gone(ids)

    def cancel_step(self, g: Group, found: list[str]) -> None:
        """``scancel --signal=KILL JOB.STEP`` of the group's current step (found by its name
        in one ``squeue -s``); ``found`` gets the step ids. Best effort: srun is killed
        whatever Slurm answers."""
        job = self.attempt.job_id
        if not job:
            return
        name = step_name(g.state.group, g.state.restarts)
        try:
            ids = list(g.step_ids) or self.client.steps_by_name(job).get(name, [])
            if not ids:
                say(f"group {g.state.group}: step {name} is not in the queue (ended already)")
                return
            found.extend(ids)
            say(f"group {g.state.group}: {shlex.join(scancel_argv(ids, CANCEL_SIGNAL))}")
            self.client.cancel(ids, signal=CANCEL_SIGNAL)
        except Exception as exc:
            say(f"warning: group {g.state.group}: its step was not cancelled: {exc}")

    def wait_step_gone(self, ids: list[str]) -> None:
        """Until none of ``ids`` is in the queue (its tasks ended on every node), at most
        ``STEP_GONE_S``: a restart on the same nodes must not meet the old step's ranks."""
        job = self.attempt.job_id
        deadline = time.monotonic() + STEP_GONE_S
        while time.monotonic() < deadline:
            try:
                listed = {i for found in self.client.steps_by_name(job).values() for i in found}
            except Exception:
                return
            if not listed & set(ids):
                return
            time.sleep(STEP_GONE_POLL_S)
        left = ", ".join(ids)
        say(f"warning: step(s) {left} still in the queue {STEP_GONE_S:.0f} s after scancel")

    # ------------------------------------------------------------------ hangs

    def group_beats(self, beats: list[analysis.Beat]) -> dict[int, list[analysis.Beat]]:
        """Group -> its ranks' beats since its current start (a restarted group's old ranks
        may have left their records behind, on a node it left for a spare), for the groups
        not given up. One pass over the beats, each placed by its rank (O(n log groups))."""
        live = sorted((g for g in self.groups if not g.state.given_up), key=lambda g: g.rank_offset)
        offsets = [g.rank_offset for g in live]
        out: dict[int, list[analysis.Beat]] = {g.state.group: [] for g in live}
        for b in beats:
            i = bisect.bisect_right(offsets, b.rank) - 1
            if i < 0:
                continue
            g = live[i]
            size = len(g.state.nodes) * self.settings.ranks_per_node
            if b.rank < g.rank_offset + size and b.started >= g.started - 1.0:
                out[g.state.group].append(b)
        return out

    def record_beats(self, now: float) -> dict[int, list[analysis.Beat]]:
        """The heartbeats of each group that is not given up, from its current start (one
        read for every group), summarised into ``health/watchdog.json`` and, when the step
        advanced, the step history (``health/steps.jsonl``): the watchdog's records, which
        ``status`` and ``report`` read. Best effort: a failed write never stops the groups."""
        a = self.attempt
        records = heartbeats.read_heartbeats(self.run_dir)
        beats = analysis.current_beats(records, a.job_id, a.restart, 0.0, a.relaunch)
        per_group = self.group_beats(beats)
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

    def watch_hangs(self, now: float) -> int | None:
        """The hang verdict per group, once a watchdog poll period (``health.hang_timeout``
        and the watchdog's rule on each watched group's ranks; ``policy.groups.hung_groups``
        picks the hung ones): end each hung group's step (it restarts like a crash, cause
        ``hang``); every group hung: the whole job's failure (the exit code). The same read
        of the heartbeats gives ``status`` and ``report`` the step history, as the watchdog
        does in ``mode: job``."""
        s = self.settings
        t = s.thresholds
        if s.hang_timeout <= 0 or now - self.last_hang_check < poll_period(t):
            return None
        self.last_hang_check = now
        per_group = self.record_beats(now)
        # A restarted group that has not rejoined answers to heal_timeout instead.
        watched = [
            g
            for g in self.groups
            if g.proc is not None and g.state.running and g.state.rejoined and not g.ended_why
        ]
        if not watched:
            return None
        a = self.attempt
        views: list[policy.GroupBeats] = []
        by_group: dict[int, Group] = {}
        for g in watched:
            mine = per_group.get(g.state.group, [])
            last = analysis.last_progress(mine)
            if last is None:  # no heartbeat from this start yet: nothing to judge
                continue
            running = [b for b in mine if b.state == "running"]
            views.append(
                policy.GroupBeats(
                    g.state.group,
                    analysis.detect_hang(mine, now, t, len(g.state.nodes) * s.ranks_per_node),
                    last,
                    len(analysis.frozen(running, now, t)) == len(running),
                )
            )
            by_group[g.state.group] = g
        verdict = policy.hung_groups(views, now, t, self.changed)
        if verdict.whole_job is not None:
            finding = verdict.whole_job
            # The watchdog's verdict record: the end hook concludes the attempt as a hang.
            watchdog_records.write_verdict(
                self.run_dir,
                a,
                watchdog_records.Verdict(
                    cause=finding.cause,
                    nodes=tuple(finding.nodes),
                    ranks=tuple(finding.ranks),
                    detail=finding.detail,
                    time=now,
                    job_id=a.job_id,
                    restart=a.restart,
                ),
            )
            self.end_all(f"hang: {finding.detail}")
            return WHOLE_JOB_FAILED
        for group, finding in verdict.hung:
            g = by_group[group]
            g.cause, g.detail, g.blamed = finding.cause, finding.detail, finding.nodes
            g.ended_why = f"hang: {finding.detail}"
            self.end_step(g)
        if not verdict.hung:
            self.watch_stragglers(now, [g for g in watched if g.state.group in by_group], per_group)
        return None

    def watch_stragglers(
        self, now: float, watched: list[Group], per_group: dict[int, list[analysis.Beat]]
    ) -> None:
        """The watchdog's straggler rule over the watched groups' nodes (each node's busy
        time per step against the other nodes' median, for ``straggler_patience``; the same
        rule and the same limits as in ``mode: job``): the slow node's group restarts with a
        hot spare in its place (``policy.decide`` must agree); otherwise it is said once and
        the group trains on, since giving a slow group up, or ending every group, costs more
        than its slowness."""
        beats = [b for g in watched for b in per_group.get(g.state.group, [])]
        finding = analysis.detect_straggler(beats, now, self.settings.thresholds, self.stragglers)
        if finding is None:
            return
        for g in watched:
            slow = tuple(n for n in finding.nodes if n in g.state.nodes)
            if not slow:
                continue
            unusable = set(slow) | set(exclusions.excluded(self.run_dir))
            spares, decision = self.restart_of(g, [x.state for x in self.groups], unusable)
            if decision.action != policy.RESTART:
                if not set(slow) <= self.said_slow:
                    self.said_slow |= set(slow)
                    why = (
                        f"no hot spare can take the place of {', '.join(slow)}"
                        if policy.restart_nodes(g.state, unusable, spares) is None
                        else f"its restart would not run: {decision.reason}"
                    )
                    say(f"group {g.state.group}: {finding.detail}; it trains on ({why})")
                continue
            g.cause, g.detail, g.blamed, g.avoid = finding.cause, finding.detail, slow, slow
            g.ended_why = f"straggler: {finding.detail}"
            self.end_step(g)

    # ------------------------------------------------------------------ failure

    def attribution(self, g: Group) -> tuple[str, list[dict[str, object]]]:
        """(culprit, causes) of the group's failure, job-wide rank numbers."""
        step = self.step_log(g)
        ends = tuple(replace(e, rank=e.rank + g.rank_offset) for e in step.ends)
        step = replace(step, ends=ends)
        causes = attrib.rank_causes(step, self.group_failures(g))
        culprit = causes[0].text if causes else (g.ended_why or "")
        return culprit, [c.as_dict() for c in causes[:10]]

    def restart_of(
        self, g: Group, states: list[GroupState], unusable: set[str]
    ) -> tuple[list[str], policy.GroupDecision]:
        """The hot spares free now and what the rules decide for ``g`` without ``unusable``."""
        spares = policy.free_nodes(self.allocation, states, unusable)
        decision = policy.decide(
            g.state,
            states,
            unusable=unusable,
            spares=spares,
            max_restarts=self.settings.max_restarts,
            min_groups=self.settings.min_groups,
        )
        return spares, decision

    def on_failure(self, g: Group, code: int | None) -> int | None:
        """Restart, give up or fail the job; the exit code when the job fails."""
        now = self.clock()
        culprit, causes = self.attribution(g)
        if g.detail:  # a verdict's: the srun log shows only the supervisor's own kill
            culprit = g.detail
        cause = g.cause or g.ended_why or (culprit or f"its step exited with code {code}")
        if g.avoid:  # a straggler: out of this run, and on the bad-node list (evidence)
            why = f"straggler under replica group {g.state.group}: {g.detail}"
            exclusions.add_excluded(self.run_dir, g.avoid, why)
            with contextlib.suppress(Exception):
                badnodes.record(
                    list(g.avoid), why, self.settings.bad_node_ttl_hours, f"run {self.run_dir.name}"
                )
        unusable = set(g.dead) | set(g.avoid) | set(exclusions.excluded(self.run_dir))
        states = [x.state if x is g else self.seen(x) for x in self.groups]
        _, decision = self.restart_of(g, states, unusable)
        entry: dict[str, object] = {
            "group": g.state.group,
            "restart": g.state.restarts,
            "time": now,
            "up_s": round(now - g.started, 3),
            "cause": cause,
            "culprit": culprit,
            "causes": causes,
            "nodes": list(g.state.nodes),
            "exit_code": code,
            "decision": decision.action,
            "why": decision.reason,
        }
        if decision.nodes:
            entry["new_nodes"] = list(decision.nodes)
        if g.blamed:
            entry["blamed"] = list(g.blamed)
        if g.end_seen and g.rest_killed:
            # How long the group's other ranks outlived the first task's end, as far as the
            # supervisor can tell: the other groups' quorum waits about this long.
            entry["rest_killed_s"] = round(g.rest_killed - g.end_seen, 3)
        step = self.last_step(g)
        if step is not None:
            entry["failed_at_step"] = step
        if g.dead:
            why = f"node failure under replica group {g.state.group}: {cause}"
            exclusions.add_excluded(self.run_dir, g.dead, why)
            with contextlib.suppress(Exception):  # the bad-node list is the user's, best effort
                badnodes.record(
                    list(g.dead), why, self.settings.bad_node_ttl_hours, f"run {self.run_dir.name}"
                )
        record_restart(self.run_dir, entry)
        say(f"group {g.state.group} failed: {cause}; {decision.reason}")
        if decision.action == policy.RESTART:
            g.state = replace(g.state, nodes=decision.nodes, restarts=g.state.restarts + 1)
            self.start_group(g)
            return None
        g.state = replace(g.state, running=False, given_up=True)
        self.publish()
        if decision.action == policy.FAIL_JOB:
            self.end_all(f"the job cannot go on: {decision.reason}")
            return WHOLE_JOB_FAILED
        return None

    def seen(self, g: Group) -> GroupState:
        """The group as a decision must see it now: a step that ended in this poll but is
        not handled yet (two groups failing together) no longer runs, and a failed one holds
        no state to heal another group from."""
        code = g.proc.poll() if g.proc is not None and g.state.running else None
        if code is None:
            return g.state
        return replace(g.state, running=False, done=code == 0 and not g.ended_why)

    def end_all(self, why: str) -> None:
        say(f"ending every group: {why}")
        for g in self.groups:
            if g.proc is not None and g.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    g.proc.send_signal(signal.SIGKILL)
        for g in self.groups:
            if g.proc is not None:
                with contextlib.suppress(Exception):
                    g.proc.wait(timeout=30)

    def poll_group(self, g: Group, now: float, found: list[Failure]) -> int | None:
        """One look at a running group: watch it, note it finished, or handle its failure
        (the exit code when that fails the job)."""
        if g.proc is None or not g.state.running:
            return None
        code = g.proc.poll()
        if code is None:
            self.watch_running(g, now, found)
            return None
        if code == 0 and not g.ended_why:
            g.state = replace(g.state, running=False, done=True)
            say(f"group {g.state.group}: every rank finished")
            self.publish()
            self.end_too_late(g)
            return None
        return self.on_failure(g, code)

    def end_too_late(self, finished: Group) -> None:
        """End the restarted groups still healing when ``finished`` finished training: none
        is left to heal them from (``policy.too_late``). Given up, not failed: the training
        is done."""
        late = set(policy.too_late([self.seen(x) for x in self.groups]))
        for g in self.groups:
            if g.state.group not in late:
                continue
            why = f"group {finished.state.group} finished training before it rejoined"
            g.ended_why = why
            self.end_step(g)
            g.state = replace(g.state, running=False, given_up=True)
            record_too_late(self.run_dir, g.state.group, g.state.restarts - 1, why)
            self.publish()

    def run(self, lighthouse: subprocess.Popen[bytes] | None) -> int:
        for g in self.groups:
            self.start_group(g)
        while True:
            if self.stopping:
                self.end_all("the batch script was signalled")
                return 143
            if lighthouse is not None and lighthouse.poll() is not None:
                self.end_all(f"the lighthouse exited with code {lighthouse.returncode}")
                return WHOLE_JOB_FAILED
            now = self.clock()
            found = read_failures(self.run_dir)
            self.learn_step_ids(now)
            for g in self.groups:
                failed = self.poll_group(g, now, found)
                if failed is not None:
                    return failed
            failed = self.watch_hangs(now)
            if failed is not None:
                return failed
            if all(not g.state.running for g in self.groups):
                if self.settings.hang_timeout > 0:
                    self.record_beats(self.clock())  # the final step, into the history
                done = [g for g in self.groups if g.state.done]
                return 0 if done else WHOLE_JOB_FAILED
            time.sleep(POLL_S)


def group_srun(
    srun: Sequence[str], logs: Path, group: int, het_group: int | None = None
) -> list[str]:
    """srun's argv for one group's step: the rank logs (``rank-%t``: numbered from 0 in
    every group's step) pointed at one file per group, each rank then writing its own
    job-wide named log (``worker.task.redirect_group_logs``); and srun's own end of the step
    off (``--kill-on-bad-exit=0``): the supervisor ends it. With srun's on, slurmstepd sends
    the step TERM, holds it for Slurm's ``KillWait`` (30 s by default) and only then KILL,
    and a ``scancel --signal=KILL`` of the step waits behind that (measured on the dev
    cluster, two tasks that take TERM as a stop request, one SIGKILLed: scancel returned
    after 4.71 s with KillWait=5, the other task gone 5.0 s after the kill; without, 0.01 s
    and 0.3 s). The other groups' quorum waits for the failed group's manager that long.
    The rendered script says so already; set here too, since the supervisor's prompt end of a
    failed group depends on it whatever script started it. In a heterogeneous job
    (``components:``) a group's nodes are in one component, ``het_group``: its step runs there
    (the script's ``--het-group`` names every train component)."""
    out = []
    for arg in srun:
        if arg.startswith("--het-group=") and het_group is not None:
            arg = f"--het-group={het_group}"
        for flag, stream in (("--output=", "out"), ("--error=", "err")):
            if arg.startswith(flag) and "%t" in arg:
                arg = f"{flag}{logs / f'group-{group}.{stream}'}"
        if arg.startswith("--kill-on-bad-exit"):
            arg = "--kill-on-bad-exit=0"
        out.append(arg)
    return out


def record_restart(run_dir: Path, entry: dict[str, object]) -> None:
    """Append one group restart to the open attempt's record (a failing write must not
    stop the supervisor: the batch log has the line)."""
    try:
        records = attempts.load(run_dir)
        before = list(records[-1].group_restarts or ()) if records else []
        attempts.update_open(run_dir, group_restarts=[*before[-99:], entry])
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

    def add(entry: dict[str, object]) -> None:
        failed_at = entry.get("failed_at_step")
        if isinstance(failed_at, int):
            entry["steps_missed"] = max(step - failed_at, 0)
        entry.update(rejoined_step=step, healed=healed, rejoin_s=round(after, 3))
        if source is not None:
            entry["healed_from"] = source

    update_restart(run_dir, group, restart, add, "the rejoin")


def record_too_late(run_dir: Path, group: int, restart: int, why: str) -> None:
    """Say on the group's restart entry that it was ended before it rejoined, and why."""
    update_restart(run_dir, group, restart, lambda e: e.update(ended=why), "the group's end")


def update_restart(
    run_dir: Path,
    group: int,
    restart: int,
    change: Callable[[dict[str, object]], None],
    what: str,
) -> None:
    """Apply ``change`` to the open attempt's restart entry of ``group`` number ``restart``
    (best effort, as ``record_restart``)."""
    try:
        records = attempts.load(run_dir)
        entries = [dict(e) for e in (records[-1].group_restarts or ())] if records else []
        for entry in reversed(entries):
            if entry.get("group") == group and entry.get("restart") == restart:
                change(entry)
                break
        attempts.update_open(run_dir, group_restarts=entries)
    except Exception as exc:
        say(f"warning: {what} was not recorded: {exc!r}")


def say(line: str) -> None:
    print(f"[ddlaunch groups] {line}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def start_lighthouse(min_groups: int, log: Path, host: str) -> tuple[subprocess.Popen[bytes], str]:
    """The torchft lighthouse on this host, up and listening; (process, its address)."""
    port = free_port()
    argv = [
        sys.executable,
        str(LIGHTHOUSE_SCRIPT),
        "--min_replicas",
        str(min_groups),
        "--quorum_tick_ms",
        str(QUORUM_TICK_MS),
        "--join_timeout_ms",
        str(JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms",
        str(HEARTBEAT_TIMEOUT_MS),
        "--bind",
        f"[::]:{port}",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + LIGHTHOUSE_UP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the lighthouse exited with code {proc.returncode} (see {log})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return proc, f"http://{host}:{port}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(
        f"the lighthouse did not listen on port {port} within {LIGHTHOUSE_UP_S:.0f} s"
    )


def parse_args(argv: Sequence[str]) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.groups")
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--min-groups", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--heal-timeout", type=float, default=600.0)
    parser.add_argument("--stale-after", type=float, default=35.0)
    parser.add_argument("--bad-node-ttl-hours", type=float, default=24.0)
    parser.add_argument("--hang-timeout", type=float, default=0.0)
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    parser.add_argument("--straggler-factor", type=float, default=math.inf)
    parser.add_argument("--straggler-patience", type=float, default=300.0)
    parser.add_argument("srun", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = list(args.srun)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if WORKER_MARK not in rest:
        parser.error(f"the command line needs SRUN... {WORKER_MARK} WORKER...")
    cut = rest.index(WORKER_MARK)
    return Settings(
        groups=args.groups,
        ranks_per_node=args.ranks_per_node,
        min_groups=args.min_groups,
        max_restarts=args.max_restarts,
        heal_timeout=args.heal_timeout,
        stale_after=args.stale_after,
        bad_node_ttl_hours=args.bad_node_ttl_hours,
        srun=tuple(rest[:cut]),
        worker=tuple(rest[cut + 1 :]),
        hang_timeout=args.hang_timeout,
        heartbeat_interval=args.heartbeat_interval,
        straggler_factor=args.straggler_factor,
        straggler_patience=args.straggler_patience,
    )


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    settings = parse_args(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    run_dir = Path(env.get("DDLAUNCH_RUN_DIR", "."))
    attempt = AttemptId.from_env(env)
    nodes = expand(step_nodelist(env))
    try:
        cut = policy.group_nodes(nodes, settings.groups)
    except ValueError as exc:
        say(f"error: {exc}")
        return WHOLE_JOB_FAILED
    host = env.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        lighthouse, address = start_lighthouse(
            settings.min_groups, run_dir / LOGS_DIR / "lighthouse.log", host
        )
    except (OSError, RuntimeError) as exc:
        say(f"error: could not start the torchft lighthouse: {exc}")
        return WHOLE_JOB_FAILED
    say(f"lighthouse at {address} (min {settings.min_groups} live group(s))")
    per_group = len(cut[0]) * settings.ranks_per_node
    sup = Supervisor(
        settings,
        run_dir,
        attempt,
        expand(allocation(env)) or nodes,
        SlurmClient(),
        env,
        [Group(GroupState(i, c), i * per_group) for i, c in enumerate(cut)],
        address,
    )

    def stop(signum: int, frame: Any) -> None:
        sup.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        return sup.run(lighthouse)
    finally:
        lighthouse.terminate()
        with contextlib.suppress(Exception):
            lighthouse.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
