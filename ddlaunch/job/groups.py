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

Its shape is torch.distributed.elastic's agent: a small loop (``Supervisor.poll``) that
watches (``job.group_watch``: verdicts, never an end of a step), decides (``policy.groups``:
pure; a group's life is one ``policy.groups.Phase``) and acts (``job.group_steps``: srun
steps started, looked up and cancelled; ``job.group_records``: what it writes down;
``job.group_lighthouse``: the lighthouse). Its settings are the run's config
(``job.group_settings``: the config in the run directory, as the end hook reads it); its
command line is the script's srun argv and each rank's command only.

Why a Python supervisor and not bash: it waits on several steps at once, reads the failure
records and srun's reports of one group, and keeps per-group counts; bash's ``wait -n``
cannot tell which step ended without racing.

The parts of replica groups, by where they run (this is their index): ``config.replica_rules``
(the rules), ``planning.group_env`` (each group's environment), this module,
``job.group_settings``, ``job.group_watch``, ``job.group_steps``, ``job.group_records``,
``job.group_lighthouse`` and ``policy.groups`` (the supervisor and its decisions),
``store.groups`` (the groups' records), ``store.group_restarts`` (each group restart in the
attempt's record), ``worker.replica``, ``worker.step_manager`` and ``worker.heal_source``
(torchft's Manager in the ranks), ``app.report_groups`` (their restarts in ``report``),
``policy.replica_sim`` (the goodput model).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.job.blame import expand
from ddlaunch.job.group_lighthouse import start_lighthouse, stop_lighthouse
from ddlaunch.job.group_records import (
    leave_out,
    publish,
    record_job_hang,
    record_rejoin,
    record_restart,
    record_too_late,
    say,
)
from ddlaunch.job.group_settings import Settings, split_command
from ddlaunch.job.group_steps import Group, Steps
from ddlaunch.job.group_watch import PROBE_ALWAYS_NODES, GroupWatch, Rejoin
from ddlaunch.job.placement import allocation, step_nodelist
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.ports import master_port_for
from ddlaunch.policy import groups as policy
from ddlaunch.policy.groups import GroupState, Phase, StepEnd
from ddlaunch.policy.heartbeats import Finding
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.parse import het_group_of
from ddlaunch.store import exclusions
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import Failure, read_failures
from ddlaunch.store.group_restarts import GroupRestart
from ddlaunch.store.rundir import LOGS_DIR, config_path
from ddlaunch.wording import counted

POLL_S = 0.2
WHOLE_JOB_FAILED = 1
SIGNALLED = 143


@dataclass
class Supervisor:
    """The groups' supervisor (the module's doc): ``poll`` once, or ``run`` until the job's
    end. ``changed``: when a group was last started or ended (``policy.hung_groups``)."""

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
    changed: float = 0.0
    said_slow: set[str] = field(default_factory=set)  # stragglers said, left training
    steps: Steps = field(init=False)
    watch: GroupWatch = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.steps = Steps(
            self.client, self.attempt.job_id, s.srun, s.worker, s.ranks_per_node,
            self.run_dir / LOGS_DIR, self.clock,
        )  # fmt: skip
        self.watch = GroupWatch(
            self.run_dir, self.attempt, self.client, s.ranks_per_node, s.thresholds, s.watch,
            s.heal_timeout, len(self.allocation) <= PROBE_ALWAYS_NODES,
        )  # fmt: skip

    # ------------------------------------------------------------------ the loop

    def run(self, lighthouse: subprocess.Popen[bytes] | None = None) -> int:
        """Start every group, then poll until the job's end; the exit code."""
        for g in self.groups:
            self.start_group(g)
        while (code := self.poll(lighthouse)) is None:
            time.sleep(POLL_S)
        return code

    def poll(self, lighthouse: subprocess.Popen[bytes] | None = None) -> int | None:
        """One look at every group and the job: None while it goes on, else the exit code
        (0: every group finished or gave way to one that did)."""
        if self.stopping:
            self.end_all("the batch script was signalled")
            return SIGNALLED
        if lighthouse is not None and lighthouse.poll() is not None:
            self.end_all(f"the lighthouse exited with code {lighthouse.returncode}")
            return WHOLE_JOB_FAILED
        now = self.clock()
        found = read_failures(self.run_dir)
        self.steps.learn_ids([g.step for g in self.groups if g.state.running and g.step], now)
        for g in self.groups:
            code = self.poll_group(g, now, found)
            if code is not None:
                return code
        code = self.watch_health(now)
        if code is not None:
            return code
        if any(g.state.running for g in self.groups):
            return None
        if self.settings.watch:
            self.watch.record_beats(self.groups, self.clock())  # the final step, into the history
        return 0 if any(g.state.phase is Phase.FINISHED for g in self.groups) else WHOLE_JOB_FAILED

    def poll_group(self, g: Group, now: float, found: list[Failure]) -> int | None:
        """One look at a running group: act on the watch's verdicts, note it finished, or
        handle its failure (the exit code when that fails the job)."""
        if g.step is None or not g.state.running:
            return None
        code = g.step.proc.poll()
        if code is None:
            look = self.watch.look(g, now, found)
            if look.kill_rest:
                self.steps.kill_the_rest(g.step, g.state.group)
            if look.rejoin is not None:
                self.rejoined(g, look.rejoin)
            if look.end is not None:
                self.end_group(g, look.end)
            return None
        if code == 0 and not g.ending:
            g.state = g.state.to(Phase.FINISHED)
            say(f"group {g.state.group}: every rank finished")
            self.publish()
            self.end_too_late(g)
            return None
        return self.on_failure(g, code)

    def watch_health(self, now: float) -> int | None:
        """The heartbeats' verdicts, once a watchdog poll period: each hung group's step
        ended (it restarts like a crash, cause ``hang``), a straggler's group moved to a
        spare; every group hung: the whole job's failure (the exit code)."""
        if not self.watch.due(now):
            return None
        health = self.watch.health(self.groups, now, self.changed)
        if health.whole_job is not None:
            record_job_hang(self.run_dir, self.attempt, health.whole_job, now)
            self.end_all(f"hang: {health.whole_job.detail}")
            return WHOLE_JOB_FAILED
        for g, end in health.hung:
            self.end_group(g, end)
        if health.straggler is not None:
            self.on_straggler(health.straggler, health.watched)
        return None

    # ------------------------------------------------------------------ decide

    def restart_of(
        self, failed: GroupState, states: list[GroupState], unusable: set[str]
    ) -> tuple[list[str], policy.GroupDecision]:
        """The hot spares free now and what the rules decide for ``failed`` without
        ``unusable``."""
        spares = policy.free_nodes(self.allocation, states, unusable)
        decision = policy.decide(
            failed,
            states,
            unusable=unusable,
            spares=spares,
            max_restarts=self.settings.max_restarts,
            min_groups=self.settings.min_groups,
        )
        return spares, decision

    def seen(self, g: Group) -> GroupState:
        """The group as a decision must see it now: a step that ended in this poll but is
        not handled yet (two groups failing together) no longer runs, and a failed one holds
        no state to heal another group from."""
        code = g.step.proc.poll() if g.step is not None and g.state.running else None
        if code is None:
            return g.state
        return g.state.to(Phase.FINISHED if code == 0 and not g.ending else Phase.FAILED)

    def on_straggler(self, finding: Finding, watched: Sequence[Group]) -> None:
        """The watchdog's straggler rule found a slow node (its busy time per step against
        the other nodes' median, for ``straggler_patience``): its group restarts with a hot
        spare in its place (``policy.decide`` must agree); otherwise it is said once and the
        group trains on, since giving a slow group up, or ending every group, costs more
        than its slowness."""
        for g in watched:
            slow = tuple(n for n in finding.nodes if n in g.state.nodes)
            if not slow:
                continue
            unusable = set(slow) | set(exclusions.excluded(self.run_dir))
            states = [x.state for x in self.groups]
            spares, decision = self.restart_of(g.state, states, unusable)
            if decision.action == policy.RESTART:
                why = f"straggler: {finding.detail}"
                self.end_group(g, StepEnd(why, finding.cause, finding.detail, slow, avoid=slow))
            elif not set(slow) <= self.said_slow:
                self.said_slow |= set(slow)
                why = (
                    f"no hot spare can take the place of {', '.join(slow)}"
                    if policy.restart_nodes(g.state, unusable, spares) is None
                    else f"its restart would not run: {decision.reason}"
                )
                say(f"group {g.state.group}: {finding.detail}; it trains on ({why})")

    def on_failure(self, g: Group, code: int | None) -> int | None:
        """The group's step failed: record it, then restart the group, give it up or fail
        the job (the exit code then)."""
        step = g.step
        assert step is not None
        now = self.clock()
        end = step.end or StepEnd("")
        culprit, causes = self.watch.attribution(g)
        if end.detail:  # a verdict's: the srun log shows only the supervisor's own kill
            culprit = end.detail
        cause = end.cause or end.why or (culprit or f"its step exited with code {code}")
        st = g.state
        if end.avoid:  # a straggler: out of this run, and on the bad-node list (evidence)
            why = f"straggler under replica group {st.group}: {end.detail}"
            leave_out(self.run_dir, end.avoid, why, self.settings.bad_node_ttl_hours)
        unusable = set(end.dead) | set(end.avoid) | set(exclusions.excluded(self.run_dir))
        g.state = st.to(Phase.FAILED)
        _, decision = self.restart_of(st, [self.seen(x) for x in self.groups], unusable)
        entry = GroupRestart(
            group=st.group,
            restart=st.restarts,
            time=now,
            up_s=round(now - step.started, 3),
            cause=cause,
            culprit=culprit,
            causes=tuple(causes),
            nodes=st.nodes,
            exit_code=code,
            nulls=frozenset() if code is not None else frozenset({"exit_code"}),
            decision=decision.action,
            why=decision.reason,
            new_nodes=decision.nodes or None,
            blamed=end.blamed or None,
            # How long the group's other ranks outlived the first task's end, as far as the
            # supervisor can tell: the other groups' quorum waits about this long.
            rest_killed_s=(
                round(step.rest_killed - step.end_seen, 3)
                if step.end_seen and step.rest_killed
                else None
            ),
            failed_at_step=self.watch.last_step(g),
        )
        if end.dead:
            why = f"node failure under replica group {st.group}: {cause}"
            leave_out(self.run_dir, end.dead, why, self.settings.bad_node_ttl_hours)
        record_restart(self.run_dir, entry)
        say(f"group {st.group} failed: {cause}; {decision.reason}")
        if decision.action == policy.RESTART:
            g.state = g.state.restarted(decision.nodes)
            self.start_group(g)
            return None
        g.state = g.state.to(Phase.GIVEN_UP)
        self.publish()
        if decision.action == policy.FAIL_JOB:
            self.end_all(f"the job cannot go on: {decision.reason}")
            return WHOLE_JOB_FAILED
        return None

    # ------------------------------------------------------------------ act

    def start_group(self, g: Group) -> None:
        """Start the group's step on its nodes: a new ``Step``."""
        s, st = self.settings, g.state
        ident = GroupIdentity(st.group, s.groups, self.lighthouse_addr, g.rank_offset, st.restarts)
        job = self.attempt.task or self.attempt.job_id or "job"
        port = master_port_for(
            f"{job}.group{st.group}.{st.restarts}", self.attempt.restart, self.attempt.relaunch
        )
        env = dict(self.env)
        # The manager's port is the OS's choice (0): the group's other ranks read its
        # address from the group's store and the lighthouse from its registration, so no
        # one needs it beforehand. A port derived from the job, as the master port must be,
        # can be taken on a busy node (it lies in the ephemeral range): a group that could
        # not bind it failed at its start with "Address already in use".
        env.update(ident.env(manager_port=0))
        env["DDLAUNCH_MASTER_PORT"] = str(port)
        env["DDLAUNCH_STEP_NODELIST"] = ",".join(st.nodes)
        env["DDLAUNCH_WORLD_SIZE"] = str(len(st.nodes) * s.ranks_per_node)
        g.step = self.steps.start(st, env, het_group_of(self.env, st.nodes[0]))
        self.changed = g.step.started
        self.publish()
        last = g.rank_offset + len(st.nodes) * s.ranks_per_node - 1
        say(
            f"group {st.group}: started on {','.join(st.nodes)} (ranks {g.rank_offset}-"
            f"{last}, restart {st.restarts})"
        )

    def end_group(self, g: Group, end: StepEnd) -> None:
        """End the group's step on ``end``, a verdict; the next poll sees srun's exit and
        handles the group as failed (``on_failure``)."""
        assert g.step is not None
        g.step.end = end
        say(f"group {g.state.group}: ending its step: {end.why}")
        self.changed = self.clock()
        self.steps.end(g.step, g.state.group, dead=bool(end.dead))

    def rejoined(self, g: Group, back: Rejoin) -> None:
        g.state = g.state.to(Phase.TRAINING)
        peer = "a live group" if back.source is None else f"group {back.source}"
        how = f"healed from {peer} at step {back.step}" if back.healed else f"at step {back.step}"
        say(
            f"group {g.state.group}: rejoined the others ({how}) "
            f"{back.after:.1f} s after its restart"
        )
        st = g.state
        record_rejoin(
            self.run_dir, st.group, st.restarts - 1, back.step, back.healed, back.after,
            back.source,
        )  # fmt: skip
        self.publish()

    def end_too_late(self, finished: Group) -> None:
        """End the restarted groups still healing when ``finished`` finished training: none
        is left to heal them from (``policy.too_late``). Given up, not failed: the training
        is done."""
        late = set(policy.too_late([self.seen(x) for x in self.groups]))
        for g in self.groups:
            if g.state.group not in late:
                continue
            why = f"group {finished.state.group} finished training before it rejoined"
            self.end_group(g, StepEnd(why))
            g.state = g.state.to(Phase.GIVEN_UP)
            record_too_late(self.run_dir, g.state.group, g.state.restarts - 1, why)
            self.publish()

    def end_all(self, why: str) -> None:
        say(f"ending every group: {why}")
        self.steps.kill_all([g.step for g in self.groups if g.step is not None])

    def publish(self) -> None:
        """``groups/state.json`` for ``status`` (best effort: never stops the groups)."""
        publish(self.run_dir, self.attempt, self.clock(), [g.state for g in self.groups])


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    srun, worker = split_command(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    run_dir = Path(env.get("DDLAUNCH_RUN_DIR", "."))
    try:
        settings = Settings.of_run(run_dir, srun, worker)
    except Exception as exc:
        say(f"error: {config_path(run_dir)}: {exc}")
        return WHOLE_JOB_FAILED
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
    say(f"lighthouse at {address} (min {counted(settings.min_groups, 'live group')})")
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
        stop_lighthouse(lighthouse)


if __name__ == "__main__":
    sys.exit(main())
