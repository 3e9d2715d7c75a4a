"""The replica groups' supervisor's pieces that need no cluster: its command line, the rank
logs per group, job-wide rank names, and its records in a run directory (the supervisor
itself runs on the dev cluster: tests/test_replica_groups_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.job import groups
from ddlaunch.planning.group_env import GroupIdentity, job_rank
from ddlaunch.store import attempts, group_state


def test_the_command_line_splits_srun_from_the_worker() -> None:
    s = groups.parse_args(
        [
            "--groups", "2", "--ranks-per-node", "4", "--min-groups", "1",
            "--", "srun", "--unbuffered", "--output=/r/logs/rank-%t.out",
            groups.WORKER_MARK, "python3", "-m", "ddlaunch.worker.task", "/r/submitit",
        ]
    )  # fmt: skip
    assert (s.groups, s.ranks_per_node, s.min_groups) == (2, 4, 1)
    assert s.srun == ("srun", "--unbuffered", "--output=/r/logs/rank-%t.out")
    assert s.worker == ("python3", "-m", "ddlaunch.worker.task", "/r/submitit")


def test_a_command_line_without_the_worker_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        groups.parse_args(["--groups", "2", "--ranks-per-node", "1", "--", "srun"])
    assert f"needs SRUN... {groups.WORKER_MARK} WORKER..." in capsys.readouterr().err


def test_each_group_step_logs_to_its_own_files() -> None:
    srun = ["srun", "--output=/r/logs/rank-%t.out", "--error=/r/logs/rank-%t.err", "--x=1"]
    assert groups.group_logs(srun, Path("/r/logs"), 1) == [
        "srun",
        "--output=/r/logs/group-1.out",
        "--error=/r/logs/group-1.err",
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
        {"group": 1, "restart": 0, "cause": "node node2 died", "failed_at_step": 60},
    )
    groups.record_rejoin(tmp_path, 1, 0, 63, True, 4.25)
    (entry,) = attempts.load(tmp_path)[-1].group_restarts or ()
    assert dict(entry) == {
        "group": 1,
        "restart": 0,
        "cause": "node node2 died",
        "failed_at_step": 60,
        "rejoined_step": 63,
        "healed": True,
        "rejoin_s": 4.25,
        "steps_missed": 3,
    }


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
