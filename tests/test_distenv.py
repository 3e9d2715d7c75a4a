"""distenv: Slurm / local environment -> DistEnv -> torchrun variables (pure, no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddlaunch.planning.ports import PORT_HIGH, PORT_LOW
from ddlaunch.worker.distenv import (
    DistEnv,
    choose_backend,
    expand_hostlist,
    expand_tasks_per_node,
    from_environ,
    master_port_for,
    pick_device,
    torchrun_env,
)

# What Slurm 22.05 set in the dev cluster's 2-node x 2-task job (slurm-dev-cluster.md, sec. 5),
# plus the step variables srun adds for its tasks.
JOB_2X2 = {
    "SLURM_CLUSTER_NAME": "lab",
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODELIST": "node[1-2]",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_SUBMIT_HOST": "vm",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}
STEP_2X2 = {
    **JOB_2X2,
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NNODES": "2",
}


def task(base: dict[str, str], procid: int, localid: int, nodeid: int, **extra: str) -> dict:
    return {
        **base,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        **extra,
    }


# The four tasks exactly as the dev cluster printed them (host, PROCID, LOCALID, NODEID).
@pytest.mark.parametrize("base", [JOB_2X2, STEP_2X2], ids=["job-vars", "step-vars"])
@pytest.mark.parametrize(
    ("procid", "localid", "nodeid"), [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
)
def test_slurm_2x2_dev_cluster(base: dict, procid: int, localid: int, nodeid: int) -> None:
    d = from_environ(task(base, procid, localid, nodeid))
    assert d == DistEnv(
        rank=procid,
        local_rank=localid,
        world_size=4,
        local_world_size=2,
        node_rank=nodeid,
        num_nodes=2,
        master_addr="node1",
        master_port=master_port_for("1", 0),
        job_id="1",
        restart_count=0,
    )


def test_step_on_a_subset_of_the_job_nodes_uses_the_step_values() -> None:
    # Job on node[1-3]; this step runs 3 tasks on node[2-3] (2 + 1).
    env = task(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "node[1-3]",
            "SLURM_JOB_NUM_NODES": "3",
            "SLURM_NTASKS": "3",
            "SLURM_TASKS_PER_NODE": "1(x3)",
            "SLURM_STEP_NODELIST": "node[2-3]",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NUM_TASKS": "3",
            "SLURM_STEP_TASKS_PER_NODE": "2,1",
        },
        procid=2,
        localid=0,
        nodeid=1,
    )
    d = from_environ(env)
    assert (d.master_addr, d.num_nodes, d.world_size) == ("node2", 2, 3)
    assert (d.node_rank, d.local_rank, d.local_world_size) == (1, 0, 1)


def test_ntasks_per_node_when_no_tasks_per_node_spec() -> None:
    env = task(
        {
            "SLURM_JOB_ID": "5",
            "SLURM_JOB_NODELIST": "gpu-[01-02]",
            "SLURM_NTASKS": "8",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NTASKS_PER_NODE": "4",
        },
        5,
        1,
        1,
    )
    d = from_environ(env)
    assert (d.master_addr, d.local_world_size) == ("gpu-01", 4)


def test_array_task_identity_and_restart_count() -> None:
    env = task(
        JOB_2X2,
        0,
        0,
        0,
        SLURM_JOB_ID="43",
        SLURM_ARRAY_JOB_ID="40",
        SLURM_ARRAY_TASK_ID="3",
        SLURM_RESTART_COUNT="2",
    )
    d = from_environ(env)
    assert (d.job_id, d.restart_count) == ("40_3", 2)
    assert d.master_port == master_port_for("40_3", 2) != master_port_for("40_3", 1)


def test_explicit_port_override_wins() -> None:
    env = task(JOB_2X2, 0, 0, 0, DDLAUNCH_MASTER_PORT="29555", MASTER_PORT="1234")
    assert from_environ(env).master_port == 29555


def test_missing_nodelist_is_a_clear_error() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "1"}
    with pytest.raises(ValueError, match="NODELIST"):
        from_environ(env)


def test_submitit_local_environment() -> None:
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "local-ab12",
        "SUBMITIT_LOCAL_NTASKS": "3",
        "SUBMITIT_LOCAL_GLOBALID": "2",
        "SUBMITIT_LOCAL_LOCALID": "2",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "DDLAUNCH_MASTER_PORT": "41000",
        # a --local run inside an allocation: the local variables decide
        "SLURM_PROCID": "7",
        "SLURM_NTASKS": "8",
    }
    assert from_environ(env) == DistEnv(
        rank=2,
        local_rank=2,
        world_size=3,
        local_world_size=3,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=41000,
        job_id="local-ab12",
        restart_count=0,
    )


def test_no_launcher_is_a_single_process() -> None:
    d = from_environ({})
    assert (d.rank, d.world_size, d.master_addr) == (0, 1, "127.0.0.1")


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
        ("gpu-[01-02]", ["gpu-01", "gpu-02"]),
        ("gpu-[08-10]", ["gpu-08", "gpu-09", "gpu-10"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("node[1-2],gpu[7]", ["node1", "node2", "gpu7"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[3]-ib", ["x3-ib"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hosts", "hostlist"),
    [
        (["node1"], "node1"),
        (["node10", "node2", "node1", "node11", "node3", "node12"], "node[1-3,10-12]"),
        (["gpu-01", "gpu-02", "gpu-04"], "gpu-[01-02,04]"),
        (["login", "node5", "node5"], "node5,login"),
        (["a1", "b2", "b3"], "a1,b[2-3]"),
    ],
)
def test_compress_hostlist_is_what_expand_reads_back(hosts: list[str], hostlist: str) -> None:
    from ddlaunch.slurm.hostlist import compress_hostlist

    assert compress_hostlist(hosts) == hostlist
    assert sorted(expand_hostlist(hostlist)) == sorted(set(hosts))


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node[a-b]"])
def test_expand_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("spec", "counts"),
    [("2(x3)", [2, 2, 2]), ("2,1", [2, 1]), ("2(x2),1", [2, 2, 1]), ("4", [4])],
)
def test_expand_tasks_per_node(spec: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(spec) == counts


def test_expand_tasks_per_node_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        expand_tasks_per_node("2(3)")


def test_master_port_range_and_spread_over_1000_job_ids() -> None:
    # Realistic ids: consecutive Slurm job numbers, plus array identities.
    ids = [str(n) for n in range(81_000, 81_900)] + [f"81900_{t}" for t in range(100)]
    ports = [master_port_for(i) for i in ids]
    assert all(PORT_LOW <= p < PORT_HIGH for p in ports)
    colliding_pairs = sum(
        c * (c - 1) // 2 for c in {p: ports.count(p) for p in set(ports)}.values()
    )
    # A uniform hash gives ~30.5 colliding pairs among 1000 ids in 16384 ports.
    assert colliding_pairs < 60, colliding_pairs
    assert master_port_for("81000") == master_port_for("81000")  # deterministic


def test_master_ports_lie_below_the_default_ephemeral_range() -> None:
    """A node's outgoing connections take local ports from 32768 up (Linux's default): a
    master port there was taken (EADDRINUSE) on a busy dev-cluster node."""
    ports = {
        master_port_for(str(job), attempt, relaunch)
        for job in range(300)
        for attempt in range(3)
        for relaunch in (0, 1)
    }
    assert min(ports) >= PORT_LOW and max(ports) < PORT_HIGH <= 32768


def test_master_port_changes_with_every_attempt() -> None:
    for job in ("1", "12345", "40_3"):
        ports = [master_port_for(job, attempt) for attempt in range(50)]
        assert len(set(ports)) == 50
        assert all(PORT_LOW <= p < PORT_HIGH for p in ports)


def test_torchrun_env() -> None:
    d = DistEnv(
        rank=5,
        local_rank=1,
        world_size=8,
        local_world_size=4,
        node_rank=1,
        num_nodes=2,
        master_addr="node1",
        master_port=23456,
        job_id="9",
        restart_count=3,
    )
    assert torchrun_env(d) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "23456",
        "TORCHELASTIC_RESTART_COUNT": "3",
    }


def test_pick_device() -> None:
    assert pick_device(3, 4) == 3  # task/none: every task sees all GPUs
    assert pick_device(3, 1) == 0  # --gpus-per-task=1: each task sees its own as 0
    with pytest.raises(ValueError, match="only 2 CUDA devices"):
        pick_device(3, 2)


def test_choose_backend() -> None:
    assert choose_backend("auto", True) == "nccl"
    assert choose_backend("auto", False) == "gloo"
    assert choose_backend("gloo", True) == "gloo"
    with pytest.raises(ValueError, match="CUDA is not available"):
        choose_backend("nccl", False)


def test_worker_package_imports_without_torch() -> None:
    code = (
        "import sys, ddlaunch.worker, ddlaunch.worker.distenv, ddlaunch.worker.signals, "
        "ddlaunch.worker.distributed; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
