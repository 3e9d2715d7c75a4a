"""GPU topology inside a node and placement across nodes (pure).

Three outputs, each only where the cluster preset declares what makes it valid:

* NCCL's intra-node peer-to-peer setting for the GPU interconnect (``p2p_env``);
* srun binding flags and the per-rank CPU count (``srun_binding_args``, ``cpus_per_task``):
  only with ``cluster.cpu_binding`` / ``cluster.gpu_binding``, because the dev cluster runs
  ``TaskPlugin=task/none`` with fake GPUs, where ``--cpu-bind`` is ignored with a warning and
  ``--gpu-bind`` has no GPU affinity to work with;
* ``#SBATCH`` placement options (``placement_directives``), version-gated on
  ``cluster.slurm_version`` by validation (``config.placement_rules``): an option the
  cluster's Slurm lacks is a config error naming the version, never a script that sbatch
  rejects later.
"""

from __future__ import annotations

from ddlaunch.config.schema import Config

# NCCL_P2P_LEVEL per GPU interconnect (NCCL environment variable docs, NCCL_P2P_LEVEL: LOC,
# NVL, PIX, PXB, PHB, SYS = the longest path over which P2P is still used).
_P2P_LEVEL = {
    # Not declared: NCCL reads the node's topology itself and picks its own level.
    "auto": None,
    # NVSwitch connects every GPU pair over NVLink: allow P2P only over NVLink, so a node whose
    # NVLink fabric is down (fabric manager stopped) falls back to shared memory, which the
    # doctor flags, instead of slow P2P through PCIe bridges.
    "nvswitch": "NVL",
    # NVLink pairs or meshes (NVLink bridges, A100 4-GPU boards, AMD xGMI): NCCL detects the
    # links itself and its automatic level already prefers them; nothing to force.
    "nvlink": None,
    # PCIe only: P2P across the CPU root complex or sockets is often slower than staging in
    # host memory; PXB keeps P2P below PCIe switches (NCCL docs, NCCL_P2P_LEVEL).
    "pcie": "PXB",
}

# srun --gpu-bind per interconnect, used only with cluster.gpu_binding (srun(1) --gpu-bind).
_GPU_BIND: dict[str, str | None] = {
    # Not declared: no --gpu-bind, so Slurm's default (every task sees the node's GPUs; the
    # worker picks its own from LOCAL_RANK).
    "auto": None,
    # NVLink P2P needs the peer GPU visible to the process (CUDA peer access), so every rank
    # keeps all the node's GPUs and the worker picks its own from LOCAL_RANK. NERSC's
    # Perlmutter guidance passes --gpu-bind=none for NCCL for the same reason.
    "nvswitch": "none",
    "nvlink": "none",
    # PCIe only: little P2P to lose, and host-staged traffic wants the GPU on the rank's own
    # NUMA node: one GPU per task, the closest one (the worker then sees it as device 0).
    "pcie": "single:1",
}


def p2p_env(cfg: Config) -> dict[str, str]:
    """NCCL's intra-node P2P setting for the interconnect; empty with under two GPUs a node."""
    level = _P2P_LEVEL[cfg.topology.interconnect]
    if cfg.nodes.gpus_per_node > 1 and level:
        return {"NCCL_P2P_LEVEL": level}
    return {}


def cpus_per_task(cfg: Config) -> int | None:
    """CPUs per rank: nodes.cpus_per_task, else (with CPU binding) an even, NUMA-aware split.

    Without binding the count is left to Slurm (one CPU per task): on task/none clusters like
    the dev cluster a larger default would only make jobs claim whole nodes for nothing.
    """
    if cfg.nodes.cpus_per_task:
        return cfg.nodes.cpus_per_task
    cluster = cfg.cluster
    if not cluster.cpu_binding or not cluster.cpus_per_node:
        return None
    ranks = cfg.ranks_per_node
    numa = cluster.numa_domains or 1
    if ranks >= numa and ranks % numa == 0:
        # Split each NUMA domain among its ranks, so that with --distribution=block:block no
        # rank's cores straddle two domains even when the domains do not divide evenly.
        return max(1, (cluster.cpus_per_node // numa) // (ranks // numa))
    return max(1, cluster.cpus_per_node // ranks)


def srun_binding_args(cfg: Config) -> list[str]:
    """srun flags that bind ranks to cores and GPUs, only as far as the preset declares."""
    out: list[str] = []
    cluster = cfg.cluster
    if cluster.cpu_binding:
        cpus = cpus_per_task(cfg)
        if cpus:
            # srun 22.05-23.02 no longer inherits the batch job's --cpus-per-task, and
            # --cpu-bind=cores would then pin each rank to a single core (Slurm 22.05 and
            # 23.11 release notes; the OLMo LUMI scripts pass it explicitly for this reason).
            out.append(f"--cpus-per-task={cpus}")
        # Pack ranks node by node and their cores socket by socket: rank i then sits on the
        # socket that usually hosts GPU i (GPUs are numbered in PCI order, socket 0 first).
        out += ["--cpu-bind=cores", "--distribution=block:block"]
    gpu_bind = _GPU_BIND[cfg.topology.interconnect]
    if cluster.gpu_binding and cfg.nodes.gpus_per_node and gpu_bind:
        out.append(f"--gpu-bind={gpu_bind}")
    return out


def placement_directives(cfg: Config) -> list[tuple[str, str | None]]:
    """``#SBATCH`` placement options: --switches (topology/tree) and --segment (topology/block)."""
    topo = cfg.topology
    out: list[tuple[str, str | None]] = []
    if topo.switches:
        # Leaf-spine / fat-tree: ask for at most N leaf switches, waiting up to switch_wait
        # for them (sbatch(1) --switches=<count>[@<max-time>]; topology/tree).
        wait = f"@{topo.switch_wait}" if topo.switch_wait else ""
        out.append(("--switches", f"{topo.switches}{wait}"))
    if topo.segment:
        # Validation checked it against the preset's Slurm (``config.placement_rules``).
        out.append(("--segment", str(topo.segment)))
    return out
