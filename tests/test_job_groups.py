"""The replica groups' supervisor's pieces that need no cluster: its command line, the rank
logs per group, job-wide rank names, its records in a run directory, and its hang verdict and
step cancel with real processes standing in for each group's srun (the supervisor itself runs
on the dev cluster: tests/test_replica_groups_slurm.py)."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.samples import HEALED_GROUP_RESTART

from ddlaunch.job import group_settings, group_steps, groups
from ddlaunch.planning.group_env import GroupIdentity, job_rank
from ddlaunch.policy.groups import GroupState, Phase, StepEnd
from ddlaunch.policy.heartbeats import Thresholds
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, group_state
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.group_restarts import GroupRestart


def test_the_command_line_splits_srun_from_the_worker() -> None:
    srun, worker = group_settings.split_command(
        [
            "--", "srun", "--unbuffered", "--output=/r/logs/rank-%t.out",
            group_settings.WORKER_MARK, "python3", "-m", "ddlaunch.worker.task", "/r/submitit",
        ]
    )  # fmt: skip
    assert srun == ("srun", "--unbuffered", "--output=/r/logs/rank-%t.out")
    assert worker == ("python3", "-m", "ddlaunch.worker.task", "/r/submitit")


def test_a_command_line_without_the_worker_is_refused() -> None:
    with pytest.raises(SystemExit) as refused:
        group_settings.split_command(["--", "srun"])
    assert f"needs SRUN... {group_settings.WORKER_MARK} WORKER..." in str(refused.value)


def test_the_settings_are_the_run_configs(tmp_path: Path) -> None:
    """The script gives the supervisor its srun and worker commands only: every setting
    is the run's config, read from the run directory (the schema's defaults included)."""
    from ddlaunch.config import load_config
    from ddlaunch.policy.heartbeats import Thresholds

    path = tmp_path / "config.yaml"
    path.write_text(
        "nodes: {count: 4, gpus_per_node: 2}\n"
        "launch: {entrypoint: ddlaunch.examples.mlp:main, backend: gloo}\n"
        "parallel: {dp_replicate: 2}\n"
        "health: {hang_timeout: 90, watchdog: false}\n"
        "fault_tolerance: {mode: replica_groups, min_replica_groups: 1, heal_timeout: 120}\n"
    )
    cfg = load_config(path)
    s = group_settings.Settings.of_run(tmp_path, ("srun",), ("w",))
    assert (s.groups, s.ranks_per_node, s.min_groups, s.heal_timeout) == (2, 2, 1, 120)
    assert s.max_restarts == cfg.fault_tolerance.max_restarts
    assert s.thresholds == Thresholds.of(cfg.health) and s.thresholds.hang_timeout == 90
    assert not s.watch  # health.watchdog off: no hang or straggler verdict
    assert (s.srun, s.worker) == (("srun",), ("w",))


def test_each_group_step_logs_to_its_own_files_and_is_ended_by_the_supervisor() -> None:
    srun = [
        "srun",
        "--output=/r/logs/rank-%t.out",
        "--error=/r/logs/rank-%t.err",
        "--kill-on-bad-exit=1",
        "--x=1",
    ]
    assert group_steps.group_srun(srun, Path("/r/logs"), 1) == [
        "srun",
        "--output=/r/logs/group-1.out",
        "--error=/r/logs/group-1.err",
        "--kill-on-bad-exit=0",
        "--x=1",
    ]


def test_ranks_are_named_job_wide_in_a_group() -> None:
    env = GroupIdentity(1, 2, "http://node1:1", rank_offset=4).env(manager_port=29511)
    assert job_rank({**env, "SLURM_PROCID": "3"}) == 7
    assert job_rank({"SLURM_PROCID": "3"}) is None  # not a replica group
    assert GroupIdentity.from_env({**env, "REPLICA_GROUP_ID": "0"}) == GroupIdentity(
        0, 2, "http://node1:1", 4, 0
    )


def open_attempt(run_dir: Path) -> None:
    attempts.save(run_dir, [attempts.AttemptRecord(attempt=0, job_id="7", start=1.0)])


def test_a_group_restart_and_its_rejoin_are_recorded_in_the_attempt(tmp_path: Path) -> None:
    open_attempt(tmp_path)
    groups.record_restart(
        tmp_path,
        GroupRestart(group=1, restart=0, cause="node node2 died", failed_at_step=60),
    )
    groups.record_rejoin(tmp_path, 1, 0, 63, True, 4.25, source=0)
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert entry.to_json() == {
        "group": 1,
        "restart": 0,
        "cause": "node node2 died",
        "failed_at_step": 60,
        "rejoined_step": 63,
        "healed": True,
        "rejoin_s": 4.25,
        "steps_missed": 3,
        "healed_from": 0,
    }


def test_a_group_restart_entry_is_typed_and_rewritten_as_read() -> None:
    """Every reader gets the typed entry; keys of another version, nulls and whole numbers
    come back as they were, and a mistyped field reads as not known."""
    raw = {
        "group": 1, "restart": 0, "time": 5, "exit_code": None, "causes": [],
        "nodes": ["node2"], "healed": True, "later_key": {"a": 1},
    }  # fmt: skip
    entry = GroupRestart.from_json(raw)
    assert (entry.group, entry.time, entry.exit_code, entry.nodes) == (1, 5, None, ("node2",))
    assert entry.to_json() == raw
    back = entry.rejoined(9, True, 1.23456, source=0)
    assert (back.rejoined_step, back.rejoin_s, back.healed_from, back.back) == (9, 1.235, 0, 6.235)
    assert GroupRestart.from_json({"group": "one", "time": 5.0}).group is None


def test_the_group_restart_line_names_the_group_it_healed_from() -> None:
    from ddlaunch.cli.status import group_restart_line

    entry = HEALED_GROUP_RESTART
    assert group_restart_line(entry) == (
        "group 1 failed after 61s: hang (no step finished for 40 s (hang_timeout 30 s); "
        "rank(s) 3 heartbeat stopped); restarted on node2; rejoined at step 63 in 4.2s, "
        "healed from group 0, 3 steps missed"
    )


def test_a_heal_record_names_its_source_and_an_older_one_reads_without(tmp_path: Path) -> None:
    from ddlaunch import fsutil
    from ddlaunch.store import groups as records

    heal = records.HealRecord(
        group=1, restart=1, healed_from_step=63, step_before=0, healed_at=5.0,
        seconds_from_start=4.1, healed_from_group=0,
    )  # fmt: skip
    records.write_heal(tmp_path, heal)
    assert records.read_heal(tmp_path, 1, 1) == heal
    older = {k: v for k, v in dataclasses.asdict(heal).items() if k != "healed_from_group"}
    fsutil.atomic_write_json(records.heal_path(tmp_path, 1, 2), older)
    read = records.read_heal(tmp_path, 1, 2)
    assert read is not None and read.healed_from_group is None


def test_the_groups_state_round_trips(tmp_path: Path) -> None:
    views = (
        group_state.GroupView(0, ("node1",), group_state.TRAINING, 0),
        group_state.GroupView(1, ("node3",), group_state.HEALING, 1),
    )
    state = group_state.GroupsState("7", 0, 0, 12.5, views)
    group_state.write_state(tmp_path, state)
    assert group_state.read_state(tmp_path) == state
    assert state.live == 2


def test_torchtitan_in_a_replica_group_gets_its_own_torchft_flags(tmp_path: Path) -> None:
    from ddlaunch.config import load_config
    from ddlaunch.worker.trainer import torchtitan_ft_args

    cfg_path = tmp_path / "titan.yaml"
    cfg_path.write_text(
        "nodes: {count: 4, gpus_per_node: 2}\n"
        "launch: {module: torchtitan.train, backend: gloo}\n"
        "trainer: {kind: torchtitan}\n"
        "parallel: {dp_replicate: 2}\n"
        "fault_tolerance: {mode: replica_groups, min_replica_groups: 1}\n"
    )
    cfg = load_config(cfg_path)
    env = GroupIdentity(1, 2, "http://node1:29510", rank_offset=4).env(manager_port=29512)
    assert torchtitan_ft_args(cfg, {**env, "SLURM_PROCID": "0"}) == [
        "--fault_tolerance.enable",
        "--fault_tolerance.replica_id=1",
        "--fault_tolerance.group_size=2",
        "--fault_tolerance.min_replica_size=1",
    ]
    assert torchtitan_ft_args(cfg, {"SLURM_PROCID": "0"}) == []  # not in a group


def test_a_replica_groups_mesh_is_the_groups_inner_plan(tmp_path: Path) -> None:
    from ddlaunch.config import load_config
    from ddlaunch.worker.mesh import mesh_plan

    path = tmp_path / "hsdp.yaml"
    path.write_text(
        "nodes: {count: 4, gpus_per_node: 2}\n"
        "launch: {entrypoint: ddlaunch.examples.mlp:main, backend: gloo}\n"
        "parallel: {dp_replicate: 2, dp_shard: 4}\n"
        "fault_tolerance: {mode: replica_groups}\n"
    )
    cfg = load_config(path)
    env = GroupIdentity(0, 2, "http://node1:1", rank_offset=0).env(manager_port=1)
    inner = mesh_plan(cfg, {**env, "SLURM_PROCID": "0"})
    assert (inner.world, dict(zip(inner.names, inner.shape, strict=True))["dp_replicate"]) == (4, 1)
    assert mesh_plan(cfg, {}).world == 8  # outside a group: the job's plan


def test_status_says_which_groups_train() -> None:
    from ddlaunch.app.status import groups_summary

    views = (
        group_state.GroupView(0, ("node1",), group_state.TRAINING, 0),
        group_state.GroupView(1, ("node3",), group_state.HEALING, 1),
    )
    state = group_state.GroupsState("7", 0, 0, 12.5, views)
    assert groups_summary(state) == (
        "replica groups: 1 of 2 training (group 1 healing on node3, restart 1)"
    )
    every = group_state.GroupsState("7", 0, 0, 1.0, views[:1])
    assert groups_summary(every) == "replica groups: 1 of 1 training"


# ------------------------------------------------ the supervisor with stand-ins for srun

# What each group's "srun" runs here: a process that lives until it is killed (srun's
# options, which start_group appends, are its ignored arguments).
SRUN = (sys.executable, "-c", "import time; time.sleep(300)")


def settings(
    count: int = 2,
    ranks_per_node: int = 2,
    *,
    max_restarts: int = 3,
    heal_timeout: float = 600,
    srun: tuple[str, ...] = SRUN,
    worker: tuple[str, ...] = (),
    hang_timeout: float = 0,
    straggler_factor: float = 2.0,
    straggler_patience: float = 300,
) -> group_settings.Settings:
    """The supervisor's settings (heartbeats every second: stale after 8 s); ``hang_timeout``
    0: no hang or straggler verdicts, as with ``health.watchdog`` off."""
    return group_settings.Settings(
        groups=count, ranks_per_node=ranks_per_node, min_groups=1, max_restarts=max_restarts,
        heal_timeout=heal_timeout, bad_node_ttl_hours=0,
        thresholds=Thresholds(hang_timeout or 600, 1, straggler_factor, straggler_patience),
        watch=hang_timeout > 0, srun=srun, worker=worker,
    )  # fmt: skip


class Slurm:
    """The controller's side, for the fake runner: the job's steps by name; cancelling one
    ends its srun (as Slurm's killing of the step's tasks makes srun return)."""

    def __init__(self) -> None:
        self.steps: dict[str, str] = {}  # step id -> name
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # step id -> its "srun"
        self.names: dict[str, str] = {}  # every step started, ended ones too
        # (what, step, whether a step of its group runs: the cancelled one / an old one)
        self.events: list[tuple[str, str, bool]] = []

    def answer(self, argv: list[str]) -> CommandResult | None:
        if argv[:3] == ["squeue", "-h", "-s"]:
            lines = "".join(f"{i}|{n}\n" for i, n in self.steps.items())
            return CommandResult(tuple(argv), 0, f"77.batch|batch\n{lines}", "")
        if argv[0] == "scancel":
            for step in argv[2:]:
                proc = self.procs[step]
                self.events.append(("scancel", step, proc.poll() is None))
                proc.send_signal(signal.SIGTERM)
                proc.wait()
                self.steps.pop(step, None)
            return CommandResult(tuple(argv), 0, "", "")
        return None


class Recording(groups.Supervisor):
    """The supervisor, telling ``Slurm`` about each step it starts."""

    slurm: Slurm

    def start_group(self, g: groups.Group) -> None:
        super().start_group(g)
        assert g.proc is not None
        step = f"77.{len(self.slurm.procs)}"
        self.slurm.steps[step] = group_steps.step_name(g.state.group, g.state.restarts)
        self.slurm.procs[step] = g.proc
        mine = f"ddlaunch-group-{g.state.group}-"
        old = [
            s
            for s, p in self.slurm.procs.items()
            if p is not g.proc and p.poll() is None and self.slurm.names[s].startswith(mine)
        ]
        self.slurm.names[step] = self.slurm.steps[step]
        self.slurm.events.append(("start", step, bool(old)))


def node_beats(run_dir: Path, host: str, ranks: list[dict[str, object]], at: float) -> None:
    from ddlaunch.store.heartbeats import node_heartbeat_path, write_node_record

    path = node_heartbeat_path(run_dir, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_node_record(path, host, ("77", 0, 0), at, ranks)


def rank_beat(rank: int, host: str, started: float, step_wall: float, at: float) -> dict:
    return {
        "rank": rank, "host": host, "job_id": "77", "restart": 0, "relaunch": 0,
        "started": started, "state": "running", "step": 40, "step_wall": step_wall,
        "beat": at, "waiting": True,
    }  # fmt: skip


def two_groups(tmp_path: Path, slurm: Slurm, now: list[float]) -> Recording:
    """A supervisor of 2 groups of 1 node x 2 ranks, both started at ``now[0]``."""
    open_attempt(tmp_path)
    sup = Recording(
        settings(hang_timeout=30),
        tmp_path,
        AttemptId("77", 0),
        ["node1", "node2"],
        SlurmClient(FakeRunner(on_run=slurm.answer)),
        {},
        [
            groups.Group(GroupState(0, ("node1",)), 0),
            groups.Group(GroupState(1, ("node2",)), 2),
        ],
        "http://batch:1",
        clock=lambda: now[0],
    )
    sup.slurm = slurm
    for g in sup.groups:
        sup.start_group(g)
    return sup


def test_a_failed_groups_other_tasks_are_killed_with_one_slurm_call(tmp_path: Path) -> None:
    """The steps' ids are looked up while the groups train (one squeue for all), so the kill
    of a failed group's other tasks, which the other groups' quorum waits for, is one
    scancel."""
    slurm = Slurm()
    now = [1000.0]
    sup = two_groups(tmp_path, slurm, now)
    calls = sup.client.runner.calls  # type: ignore[attr-defined]
    try:
        steps = [g.step for g in sup.groups if g.step is not None]
        sup.steps.learn_ids(steps, 1000.5)  # srun has not made the steps yet
        assert calls == []
        sup.steps.learn_ids(steps, 1001.5)
        assert [c[0] for c in calls] == ["squeue"]
        assert [s.ids for s in steps] == [("77.0",), ("77.1",)]
        sup.steps.learn_ids(steps, 1003.0)  # every id known: no call
        assert len(calls) == 1
        g1 = steps[1]
        now[0] = 1010.0
        sup.steps.kill_the_rest(g1, 1)
        deadline = time.monotonic() + 10
        while not g1.rest_killed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls[1:] == [["scancel", "--signal=KILL", "77.1"]]
        assert g1.killing and g1.end_seen == g1.rest_killed == 1010.0
        assert sup.groups[0].proc is not None and sup.groups[0].proc.poll() is None
    finally:
        for g in sup.groups:
            if g.proc is not None and g.proc.poll() is None:
                g.proc.kill()
                g.proc.wait()


def test_a_hung_group_is_cancelled_waited_for_and_restarted_alone(tmp_path: Path) -> None:
    slurm = Slurm()
    now = [1000.0]
    sup = two_groups(tmp_path, slurm, now)
    survivor = sup.groups[0].proc
    assert survivor is not None
    # 40 s later: group 0 waits for group 1 (its ranks beat, its step stopped with group
    # 1's); group 1's rank 3 froze (SIGSTOP) 39 s ago.
    now[0] = 1042.0
    waiting = [rank_beat(r, "node1", 1001, 1002, 1041.5) for r in (0, 1)]
    node_beats(tmp_path, "node1", waiting, 1041.5)
    frozen = rank_beat(3, "node2", 1001, 1002, 1003)
    node_beats(tmp_path, "node2", [rank_beat(2, "node2", 1001, 1002, 1041.5), frozen], 1041.5)
    sup.changed = 1001.0
    assert sup.watch_health(now[0]) is None
    (g0, g1) = sup.groups
    assert g0.step is not None and g0.step.end is None
    assert g1.step is not None and g1.step.end is not None
    assert g1.step.end.why.startswith("hang: ")
    assert sup.on_failure(g1, g1.proc.poll() if g1.proc else None) is None

    # Cancel (while its srun still ran), the step gone, then the restart: in that order.
    assert slurm.events == [
        ("start", "77.0", False),
        ("start", "77.1", False),
        ("scancel", "77.1", True),
        ("start", "77.2", False),  # no step of group 1 left running
    ]
    assert ["scancel", "--signal=KILL", "77.1"] in sup.client.runner.calls  # type: ignore[attr-defined]
    assert survivor.poll() is None and g0.proc is survivor  # group 0 untouched
    assert g1.state.restarts == 1 and g1.proc is not None and g1.proc.poll() is None
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert (entry.group, entry.cause, entry.nodes, entry.blamed, entry.decision) == (
        1,
        "hang",
        ("node2",),
        ("node2",),
        "restart",
    )
    assert entry.culprit == (
        "no step finished for 40 s (hang_timeout 30 s); rank 3 heartbeat stopped (process frozen)"
    )
    assert entry.new_nodes == ("node2",)
    # On disk, the keys every version wrote.
    (raw,) = json.loads((tmp_path / "attempts.json").read_text())[-1]["group_restarts"]
    assert sorted(raw) == sorted([
        "group", "restart", "time", "up_s", "cause", "culprit", "causes", "nodes",
        "exit_code", "decision", "why", "new_nodes", "blamed", "failed_at_step",
    ])  # fmt: skip
    assert raw["exit_code"] == -signal.SIGTERM and raw["up_s"] == 42.0  # the fake scancel
    # The same read of the heartbeats gave status and report the step history.
    (sample,) = watchdog_records.read_samples(tmp_path)
    assert (sample.time, sample.step, sample.job_id) == (1042.0, 40, "77")
    sup.end_all("the test is over")
    assert survivor.poll() is not None


def test_the_steps_are_found_by_name() -> None:
    from ddlaunch.slurm.queue import parse_step_names

    # squeue -h -s -j 77 -o '%i|%j' (the shape recorded in fixtures/slurm-22.05, with names)
    listed = "77.batch|batch\n77.extern|extern\n77.0|ddlaunch-group-0-0\n77.3|ddlaunch-group-1-1\n"
    assert parse_step_names(listed) == {
        "ddlaunch-group-0-0": ["77.0"],
        "ddlaunch-group-1-1": ["77.3"],
    }
    assert group_steps.step_name(1, 1) == "ddlaunch-group-1-1"


def test_each_group_step_is_named_for_its_group_and_restart(tmp_path: Path) -> None:
    named = settings(
        1, 1, max_restarts=0, heal_timeout=60,
        srun=(sys.executable, "-c", "import sys; print(sys.argv[1:])"), worker=("w",),
    )  # fmt: skip
    sup = groups.Supervisor(
        named, tmp_path, AttemptId("77", 0), ["n1"], SlurmClient(FakeRunner()), {},
        [groups.Group(GroupState(0, ("n1",), restarts=2), 0)], "http://batch:1",
    )  # fmt: skip
    (g,) = sup.groups
    sup.start_group(g)
    assert g.proc is not None and g.proc.wait(timeout=30) == 0
    # What srun is given after its own argv.
    assert g.proc.args[3:] == [
        "--job-name=ddlaunch-group-0-2", "--overlap", "--nodes=1", "--ntasks=1",
        "--nodelist=n1", "w",
    ]  # fmt: skip


def test_a_dead_nodes_group_step_is_cancelled_aside_and_srun_killed(tmp_path: Path) -> None:
    """scancel waits for a dead node's slurmd (MessageTimeout): the supervisor gives it
    CANCEL_WAIT_S, kills srun (which would wait for that node until Slurm declares it
    down) and does not wait for the step to leave the queue (it stays until then)."""
    open_attempt(tmp_path)
    seen: list[tuple[str, bool]] = []
    srun: list[subprocess.Popen[bytes]] = []

    def answer(argv: list[str]) -> CommandResult | None:
        if argv[:3] == ["squeue", "-h", "-s"]:
            seen.append(("squeue", srun[0].poll() is None))
            return CommandResult(tuple(argv), 0, "77.4|ddlaunch-group-0-0\n", "")
        if argv[0] == "scancel":
            seen.append(("scancel " + " ".join(argv[1:]), srun[0].poll() is None))
            time.sleep(4)  # the dead node's MessageTimeout
            return CommandResult(tuple(argv), 0, "", "")
        return None

    sup = groups.Supervisor(
        settings(1, 1, max_restarts=1, heal_timeout=60), tmp_path, AttemptId("77", 0),
        ["node1", "node2"],
        SlurmClient(FakeRunner(on_run=answer)), {},
        [groups.Group(GroupState(0, ("node1", "node2")), 0)], "http://batch:1",
    )  # fmt: skip
    (g,) = sup.groups
    sup.start_group(g)
    assert g.proc is not None
    srun.append(g.proc)
    began = time.monotonic()
    sup.end_group(g, StepEnd("node node2 died", dead=("node2",)))
    took = time.monotonic() - began
    assert g.proc.returncode == -signal.SIGKILL
    assert seen == [("squeue", True), ("scancel --signal=KILL 77.4", True)]
    assert group_steps.CANCEL_WAIT_S <= took < group_steps.CANCEL_WAIT_S + 2.0, took


def test_groups_failing_in_the_same_poll_fail_the_job_not_restart_from_nothing(
    tmp_path: Path,
) -> None:
    open_attempt(tmp_path)
    failing = settings(2, 1, heal_timeout=60, srun=(sys.executable, "-c", "raise SystemExit(1)"))
    sup = groups.Supervisor(
        failing, tmp_path, AttemptId("77", 0), ["node1", "node2"],
        SlurmClient(FakeRunner()), {},
        [groups.Group(GroupState(0, ("node1",)), 0), groups.Group(GroupState(1, ("node2",)), 1)],
        "http://batch:1",
    )  # fmt: skip
    original = sup.start_group

    def start_and_end(g: groups.Group) -> None:
        original(g)
        assert g.proc is not None
        g.proc.wait(timeout=30)  # both steps have ended by the supervisor's first poll

    sup.start_group = start_and_end  # type: ignore[method-assign]
    assert sup.run(None) == groups.WHOLE_JOB_FAILED
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert (entry.group, entry.decision) == (0, "fail_job")
    assert entry.cause == "its step exited with code 1"


def straggler_supervisor(tmp_path: Path, slurm: Slurm, allocation: list[str]) -> Recording:
    sup = Recording(
        settings(hang_timeout=600, straggler_patience=10), tmp_path, AttemptId("77", 0), allocation,
        SlurmClient(FakeRunner(on_run=slurm.answer)), {},
        [groups.Group(GroupState(0, ("node1",)), 0), groups.Group(GroupState(1, ("node2",)), 2)],
        "http://batch:1", clock=time.time,
    )  # fmt: skip
    sup.slurm = slurm
    for g in sup.groups:
        sup.start_group(g)
    return sup


def busy_beats(run_dir: Path, host: str, ranks: tuple[int, int], busy: float) -> None:
    now = time.time()
    records = [
        {**rank_beat(r, host, now, now - 0.5, now), "busy_time": busy, "step_time": 0.6}
        for r in ranks
    ]
    node_beats(run_dir, host, records, now)


def test_a_straggling_node_moves_its_group_to_the_spare(tmp_path: Path) -> None:
    open_attempt(tmp_path)
    slurm = Slurm()
    sup = straggler_supervisor(tmp_path, slurm, ["node1", "node2", "node3"])
    # node2 is busy 5x as long a step as node1 (the others wait for it at the boundary).
    busy_beats(tmp_path, "node1", (0, 1), 0.1)
    busy_beats(tmp_path, "node2", (2, 3), 0.5)
    now = time.time()
    assert sup.watch_health(now) is None  # slow since now: patience 10 s
    assert not any(g.ending for g in sup.groups)
    sup.watch.last_check = float("-inf")
    assert sup.watch_health(now + 11) is None
    (g0, g1) = sup.groups
    assert g1.step is not None and g1.step.end is not None
    assert g1.step.end.why.startswith("straggler: node2 busy 0.500 s/step = 5.0x")
    assert not g0.ending and g0.proc is not None and g0.proc.poll() is None
    assert sup.on_failure(g1, g1.proc.poll() if g1.proc else None) is None
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert (entry.group, entry.cause, entry.blamed, entry.nodes, entry.new_nodes) == (
        1,
        "straggler",
        ("node2",),
        ("node2",),
        ("node3",),
    )
    assert entry.why == "restart group 1 on node3 (node2 -> node3)"
    assert ("scancel", "77.1", True) in slurm.events
    from ddlaunch.store import exclusions

    assert exclusions.excluded(tmp_path) == ["node2"]
    sup.end_all("the test is over")


def test_a_straggler_without_a_spare_is_said_once_and_trains_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_attempt(tmp_path)
    slurm = Slurm()
    sup = straggler_supervisor(tmp_path, slurm, ["node1", "node2"])
    busy_beats(tmp_path, "node1", (0, 1), 0.1)
    busy_beats(tmp_path, "node2", (2, 3), 0.5)
    now = time.time()
    for later in (0, 11, 12):
        sup.watch.last_check = float("-inf")
        assert sup.watch_health(now + later) is None
    assert all(not g.ending and g.proc and g.proc.poll() is None for g in sup.groups)
    said = [line for line in capsys.readouterr().out.splitlines() if "trains on" in line]
    assert said == [
        "[ddlaunch groups] group 1: node2 busy 0.500 s/step = 5.0x the other nodes' median for "
        "11 s (straggler_factor 2.0); it trains on (no hot spare can take the place of node2)"
    ]
    assert not any(e[0] == "scancel" for e in slurm.events)
    sup.end_all("the test is over")


def test_a_group_still_healing_when_another_finishes_is_ended_and_given_up(
    tmp_path: Path,
) -> None:
    from ddlaunch.cli.status import group_restart_line

    open_attempt(tmp_path)
    slurm = Slurm()
    g0 = groups.Group(GroupState(0, ("node1",)), 0)
    # Its restart, on the spare:
    g1 = groups.Group(GroupState(1, ("node3",), restarts=1, phase=Phase.HEALING), 2)
    sup = Recording(
        settings(), tmp_path, AttemptId("77", 0), ["node1", "node2", "node3"],
        SlurmClient(FakeRunner(on_run=slurm.answer)), {}, [g0, g1], "http://batch:1",
    )  # fmt: skip
    sup.slurm = slurm
    groups.record_restart(
        tmp_path, GroupRestart(group=1, restart=0, cause="node node2 died", decision="restart",
                               nodes=("node2",), new_nodes=("node3",)),
    )  # fmt: skip
    for g in sup.groups:
        sup.start_group(g)
    assert g1.state.phase is Phase.HEALING
    # Group 0's ranks all finish (its srun exits 0) before group 1 has healed.
    assert g0.step is not None
    g0.step.proc.kill()
    g0.step.proc.wait()
    g0.step.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    g0.step.proc.wait()
    assert sup.poll_group(g0, time.time(), []) is None

    assert g0.state.phase is Phase.FINISHED
    assert g1.state.phase is Phase.GIVEN_UP and not g1.state.running
    assert ("scancel", "77.1", True) in slurm.events  # its step cancelled while it ran
    assert g1.proc is not None and g1.proc.poll() is not None
    assert sup.poll_group(g1, time.time(), []) is None  # no failure, no restart
    assert g1.state.restarts == 1
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert entry.ended == "group 0 finished training before it rejoined"
    assert group_restart_line(entry.to_json()) == (
        "group 1 failed: node node2 died; restarted on node3; ended: group 0 finished "
        "training before it rejoined"
    )
    state = group_state.read_state(tmp_path)
    assert state is not None
    assert [v.state for v in state.groups] == [group_state.FINISHED, group_state.GIVEN_UP]


def test_the_lighthouse_listens_without_torch(tmp_path: Path) -> None:
    """torchft's own command imports torch before the lighthouse listens (seconds, and on a
    loaded batch host more than the supervisor waited); ours loads the Rust extension alone."""
    pytest.importorskip("torchft")
    log = tmp_path / "lighthouse.log"
    proc, address = groups.start_lighthouse(1, log, "batch")
    try:
        assert address.startswith("http://batch:")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "_torchft" in maps  # the real lighthouse
        assert "libtorch" not in maps  # and no torch library loaded
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "Lighthouse listening on: http://" in log.read_text()
