"""Fabric x topology -> environment block and srun flags; CPU defaults; placement gating."""

from __future__ import annotations

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import Config, ConfigError
from ddlaunch.config.placement_rules import check_placement
from ddlaunch.config.schema import (
    ClusterSpec,
    FabricSpec,
    LaunchSpec,
    NodesSpec,
    TopologySpec,
)
from ddlaunch.planning import fabric, topology
from ddlaunch.planning.plan import LaunchPlan, make_plan

# Each fabric profile: the fabric section and the block it must produce (in this order).
FABRICS: dict[str, tuple[FabricSpec, list[tuple[str, str]]]] = {
    "ib": (
        FabricSpec(kind="ib", hcas=("mlx5_0", "mlx5_1:1"), interface="ib0"),
        [
            ("NCCL_SOCKET_IFNAME", "ib0"),
            ("GLOO_SOCKET_IFNAME", "ib0"),
            ("NCCL_IB_HCA", "=mlx5_0,mlx5_1:1"),
            ("NCCL_IB_TIMEOUT", "22"),
            ("NCCL_NET_GDR_LEVEL", "PHB"),
        ],
    ),
    "roce": (
        FabricSpec(
            kind="roce", hcas=("mlx5_0",), interface="ens1f0", gid_index=3, traffic_class=106
        ),
        [
            ("NCCL_SOCKET_IFNAME", "ens1f0"),
            ("GLOO_SOCKET_IFNAME", "ens1f0"),
            ("NCCL_IB_HCA", "=mlx5_0"),
            ("NCCL_IB_TIMEOUT", "22"),
            ("NCCL_NET_GDR_LEVEL", "PHB"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", "106"),
        ],
    ),
    "efa": (
        FabricSpec(kind="efa"),
        [
            ("FI_PROVIDER", "efa"),
            ("FI_EFA_USE_DEVICE_RDMA", "1"),
            ("FI_EFA_FORK_SAFE", "1"),
            ("FI_EFA_SET_CUDA_SYNC_MEMOPS", "0"),
        ],
    ),
    "slingshot": (
        FabricSpec(kind="slingshot", interface="hsn0"),
        [
            ("NCCL_SOCKET_IFNAME", "hsn0"),
            ("GLOO_SOCKET_IFNAME", "hsn0"),
            ("FI_PROVIDER", "cxi"),
            ("NCCL_NET", "AWS Libfabric"),
            ("NCCL_NET_GDR_LEVEL", "PHB"),
            ("NCCL_CROSS_NIC", "1"),
            ("FI_CXI_DISABLE_HOST_REGISTER", "1"),
            ("FI_MR_CACHE_MONITOR", "userfaultfd"),
            ("FI_CXI_DEFAULT_CQ_SIZE", "131072"),
        ],
    ),
    "ethernet": (
        FabricSpec(kind="ethernet", interface="eth0"),
        [
            ("NCCL_SOCKET_IFNAME", "eth0"),
            ("GLOO_SOCKET_IFNAME", "eth0"),
            ("NCCL_IB_DISABLE", "1"),
        ],
    ),
}

# Each GPU interconnect: its NCCL P2P setting and its srun --gpu-bind (with GPU binding).
TOPOLOGIES: dict[str, tuple[list[tuple[str, str]], str]] = {
    "nvswitch": ([("NCCL_P2P_LEVEL", "NVL")], "--gpu-bind=none"),
    "nvlink": ([], "--gpu-bind=none"),
    "pcie": ([("NCCL_P2P_LEVEL", "PXB")], "--gpu-bind=single:1"),
}

# A 2-socket, 64-core, 8-GPU node whose Slurm binds CPUs and GPUs.
BOUND = ClusterSpec(
    name="bound",
    gpus_per_node=8,
    cpus_per_node=64,
    numa_domains=2,
    cpu_binding=True,
    gpu_binding=True,
)
CPU_FLAGS = ["--cpus-per-task=8", "--cpu-bind=cores", "--distribution=block:block"]

TABLE = [
    (kind, inter, env + p2p, [*CPU_FLAGS, gpu_bind])
    for kind, (_, env) in FABRICS.items()
    for inter, (p2p, gpu_bind) in TOPOLOGIES.items()
]


def config(
    fab: FabricSpec,
    interconnect: str = "nvswitch",
    cluster: ClusterSpec = BOUND,
    gpus: int = 8,
    **launch: object,
) -> Config:
    return Config(
        fabric=fab,
        topology=TopologySpec(interconnect=interconnect),
        cluster=cluster,
        nodes=NodesSpec(count=2, gpus_per_node=gpus),
        launch=LaunchSpec(entrypoint="m:f", **launch),  # type: ignore[arg-type]
    )


def plan_for(cfg: Config) -> LaunchPlan:
    return make_plan(cfg, run_id="t", run_dir="/runs/t", workdir="/w")


@pytest.mark.parametrize(
    ("kind", "interconnect", "env", "srun_flags"),
    TABLE,
    ids=[f"{k}-{i}" for k, i, _, _ in TABLE],
)
def test_fabric_by_topology(
    kind: str, interconnect: str, env: list[tuple[str, str]], srun_flags: list[str]
) -> None:
    plan = plan_for(config(FABRICS[kind][0], interconnect))
    assert list(plan.fabric_env) == env
    # The binding flags follow srun's fixed options, in this order.
    assert list(plan.srun_argv[-len(srun_flags) :]) == srun_flags
    assert ("--cpus-per-task", "8") in plan.directives


def test_without_declared_binding_no_binding_flags() -> None:
    # Like the dev cluster: task/none and fake GPUs, so no --cpu-bind / --gpu-bind at all.
    cluster = ClusterSpec(name="plain", gpus_per_node=8, cpus_per_node=64, numa_domains=2)
    for inter in TOPOLOGIES:
        plan = plan_for(config(FabricSpec(kind="ib"), inter, cluster))
        flags = " ".join(plan.srun_argv)
        assert "bind" not in flags and "--distribution" not in flags
        assert "--cpus-per-task" not in flags
        assert not any(flag == "--cpus-per-task" for flag, _ in plan.directives)


def test_devcluster_render_has_no_binding_flags() -> None:
    script = prepare("examples/mlp", run_id="t", run_root="/runs", workdir="/w").script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    for flag in ("--cpu-bind", "--gpu-bind", "--distribution", "--cpus-per-task"):
        assert flag not in srun


def test_gpudirect_off() -> None:
    env = fabric.fabric_env(config(FabricSpec(kind="ib", gpudirect=False)))
    assert env["NCCL_NET_GDR_LEVEL"] == "LOC"
    env = fabric.fabric_env(config(FabricSpec(kind="efa", gpudirect=False)))
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "0"
    env = fabric.fabric_env(config(FabricSpec(kind="slingshot", gpudirect=False)))
    assert env["NCCL_NET_GDR_LEVEL"] == "LOC"


def test_roce_without_gid_leaves_it_to_nccl() -> None:
    env = fabric.fabric_env(config(FabricSpec(kind="roce")))
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_TC" not in env


def test_one_gpu_per_node_has_no_p2p_setting() -> None:
    env = fabric.fabric_env(config(FabricSpec(kind="ethernet"), "pcie", gpus=1))
    assert "NCCL_P2P_LEVEL" not in env


def test_fabric_env_extras_follow_profile_and_can_retune_it() -> None:
    fab = FabricSpec(
        kind="slingshot", env={"CXI_FORK_SAFE": "1", "FI_CXI_DEFAULT_CQ_SIZE": "65536"}
    )
    env = fabric.fabric_env(config(fab))
    assert env["CXI_FORK_SAFE"] == "1"
    assert env["FI_CXI_DEFAULT_CQ_SIZE"] == "65536"


def rule_messages(cfg: Config) -> list[str]:
    """What validation's placement rules say of ``cfg`` (``config.placement_rules``), as
    ``key: message``; the file:line comes from the config's origins (test_config_errors)."""
    found = []

    class Collector:
        def fail(self, path: tuple[str, ...], message: str, **_: object) -> None:
            found.append(f"{'.'.join(path)}: {message}")

    check_placement(cfg, Collector())
    return found


def test_fabric_env_names_are_checked() -> None:
    fab = FabricSpec(kind="ib", env={"A;touch X": "1"})
    (message,) = rule_messages(config(fab))
    assert message.startswith("fabric.env.A;touch X: must be an environment")


def test_user_env_wins_over_fabric_defaults() -> None:
    cfg = config(FABRICS["ib"][0], env={"NCCL_IB_TIMEOUT": "23", "NCCL_P2P_LEVEL": "SYS"})
    plan = plan_for(cfg)
    keys = [k for k, _ in plan.fabric_env]
    assert "NCCL_IB_TIMEOUT" not in keys and "NCCL_P2P_LEVEL" not in keys
    assert "NCCL_IB_HCA" in keys
    assert dict(plan.user_env) == {"NCCL_IB_TIMEOUT": "23", "NCCL_P2P_LEVEL": "SYS"}


def test_user_env_wins_in_rendered_script() -> None:
    script = prepare(
        "examples/megatron-modelopt",
        ["launch.env.NCCL_IB_TIMEOUT=23"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    exports = [line for line in script.splitlines() if line.startswith("export NCCL_IB_TIMEOUT=")]
    assert exports == ["export NCCL_IB_TIMEOUT=23"]


# ---------------------------------------------------------------- per-rank CPUs


@pytest.mark.parametrize(
    ("cpus", "numa", "gpus", "tasks", "expected"),
    [
        (112, 2, 8, None, 14),  # DGX H100: 56 cores a socket, 4 ranks a socket
        (56, 4, 8, None, 7),  # LUMI-G: 14 usable cores a NUMA domain, 2 GCDs each
        (128, 4, 4, None, 32),  # Perlmutter: one rank per NUMA domain (NERSC uses 32)
        (30, 4, 8, None, 3),  # domains of 7 (30 // 4): 3 each so no rank straddles two
        (64, 4, 2, None, 32),  # fewer ranks than domains: plain split
        (64, 2, 0, 4, 16),  # CPU training, 4 ranks
        (64, None, 6, None, 10),  # unknown NUMA layout: plain split
    ],
)
def test_cpus_per_task_default(
    cpus: int, numa: int | None, gpus: int, tasks: int | None, expected: int
) -> None:
    cfg = Config(
        cluster=ClusterSpec(cpus_per_node=cpus, numa_domains=numa, cpu_binding=True),
        nodes=NodesSpec(gpus_per_node=gpus, tasks_per_node=tasks),
        launch=LaunchSpec(entrypoint="m:f"),
    )
    assert topology.cpus_per_task(cfg) == expected


def test_cpus_per_task_explicit_wins_and_unbound_is_unset() -> None:
    explicit = Config(
        cluster=ClusterSpec(cpus_per_node=64, cpu_binding=True),
        nodes=NodesSpec(gpus_per_node=8, cpus_per_task=3),
    )
    assert topology.cpus_per_task(explicit) == 3
    unbound = Config(cluster=ClusterSpec(cpus_per_node=64), nodes=NodesSpec(gpus_per_node=8))
    assert topology.cpus_per_task(unbound) is None


# ---------------------------------------------------------------- placement


def placement_config(
    version: str | None, plugin: str | None = "block", count: int = 8, **topo: object
) -> Config:
    return Config(
        cluster=ClusterSpec(name="c", slurm_version=version, topology_plugin=plugin),
        nodes=NodesSpec(count=count),
        topology=TopologySpec(**topo),  # type: ignore[arg-type]
    )


def placement(
    version: str | None, plugin: str | None = "block", count: int = 8, **topo: object
) -> list[tuple[str, str | None]]:
    cfg = placement_config(version, plugin, count, **topo)
    assert rule_messages(cfg) == []  # valid: the directives are planned from it
    return topology.placement_directives(cfg)


def test_switches_render_with_wait() -> None:
    assert placement("22.05", "tree", switches=2, switch_wait="00:10:00") == [
        ("--switches", "2@00:10:00")
    ]


@pytest.mark.parametrize("version", ["24.05", "24.11", "25.05.2"])
def test_segment_renders_where_supported(version: str) -> None:
    assert placement(version, segment=4) == [("--segment", "4")]


@pytest.mark.parametrize(
    ("version", "plugin", "count", "message"),
    [
        (
            "23.11",
            "block",
            8,
            "topology.segment: --segment needs Slurm >= 24.05 with topology/block, but cluster "
            "'c' runs Slurm 23.11 (cluster.slurm_version)",
        ),
        (
            "22.05",
            "block",
            8,
            "topology.segment: --segment needs Slurm >= 24.05 with topology/block, but cluster "
            "'c' runs Slurm 22.05 (cluster.slurm_version)",
        ),
        (
            None,
            "block",
            8,
            "topology.segment: --segment needs Slurm >= 24.05; set cluster.slurm_version so it "
            "can be checked",
        ),
        (
            "24.05",
            "tree",
            8,
            "topology.segment: --segment only works with TopologyPlugin=topology/block; "
            "cluster.topology_plugin is tree",
        ),
        (
            "24.05",
            "block",
            6,
            "topology.segment: nodes.count=6 is not a multiple of the segment size 4",
        ),
    ],
)
def test_segment_is_a_config_error_where_unsupported(
    version: str | None, plugin: str, count: int, message: str
) -> None:
    assert message in rule_messages(placement_config(version, plugin, count, segment=4))


def test_segment_on_dev_cluster_preset_names_its_version() -> None:
    with pytest.raises(ConfigError, match=r"runs Slurm 22\.05"):
        prepare("examples/mlp", ["topology.segment=1"], run_id="t", run_root="/runs", workdir="/w")


# ---------------------------------------------------------------- honest defaults


def test_a_config_without_fabric_or_topology_exports_no_nccl_variable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Nothing declared: NCCL chooses (IB if present, else sockets; its own P2P level). A
    # default of ethernet used to export NCCL_IB_DISABLE=1, TCP on an InfiniBand cluster.
    (tmp_path / "job.yaml").write_text(
        "nodes: {count: 2, gpus_per_node: 8}\nlaunch: {entrypoint: m:f}\n"
    )
    prepared = prepare(str(tmp_path / "job.yaml"), run_id="t", run_root="/runs", workdir="/w")
    assert prepared.config.fabric.kind == "auto"
    assert prepared.config.topology.interconnect == "auto"
    assert prepared.plan.fabric_env == ()
    exports = [line for line in prepared.script.splitlines() if "NCCL_" in line]
    assert exports == []


def test_auto_interconnect_with_gpu_binding_leaves_gpu_bind_to_slurm() -> None:
    plan = plan_for(config(FabricSpec(kind="auto"), "auto"))
    assert plan.fabric_env == ()
    assert list(plan.srun_argv[-3:]) == CPU_FLAGS
    assert not any(a.startswith("--gpu-bind") for a in plan.srun_argv)
