"""Network fabric and GPU topology -> environment for NCCL/gloo and srun binding flags (pure).

Each default names its source. User-set ``launch.env`` always wins (applied after these).
"""

from __future__ import annotations

from ddlaunch.config.schema import Config


def fabric_env(cfg: Config) -> dict[str, str]:
    """Environment block for the configured fabric, in a stable order."""
    fab = cfg.fabric
    env: dict[str, str] = {}
    if fab.interface:
        # Bootstrap/OOB traffic and gloo use plain sockets on this interface
        # (NCCL env docs: NCCL_SOCKET_IFNAME; PyTorch distributed docs: GLOO_SOCKET_IFNAME).
        env["NCCL_SOCKET_IFNAME"] = fab.interface
        env["GLOO_SOCKET_IFNAME"] = fab.interface
    if fab.kind in ("ib", "roce"):
        if fab.hcas:
            env["NCCL_IB_HCA"] = ",".join(fab.hcas)
        # NCCL docs: NCCL_IB_TIMEOUT default 20 (since 2.14); 22 tolerates large fabrics.
        env["NCCL_IB_TIMEOUT"] = "22"
        # NCCL docs: NCCL_NET_GDR_LEVEL=PHB allows GPUDirect RDMA through the host bridge.
        env["NCCL_NET_GDR_LEVEL"] = "PHB" if fab.gpudirect else "LOC"
        if fab.kind == "roce":
            # RoCEv2 needs the GID index of the IPv4-mapped address (NVIDIA RoCE guide; 3 is
            # the common mlx5 value) and usually a lossless traffic class.
            env["NCCL_IB_GID_INDEX"] = str(fab.gid_index if fab.gid_index is not None else 3)
            if fab.traffic_class is not None:
                env["NCCL_IB_TC"] = str(fab.traffic_class)
    elif fab.kind == "efa":
        # aws-ofi-nccl README: libfabric EFA provider, GPUDirect RDMA via FI_EFA_USE_DEVICE_RDMA.
        env["FI_PROVIDER"] = "efa"
        env["FI_EFA_USE_DEVICE_RDMA"] = "1" if fab.gpudirect else "0"
        env["FI_EFA_FORK_SAFE"] = "1"
        env["NCCL_PROTO"] = "simple"
    elif fab.kind == "slingshot":
        # HPE Slingshot (CXI) with aws-ofi-nccl: NERSC/OLCF guidance for Perlmutter/Frontier.
        env["FI_PROVIDER"] = "cxi"
        env["NCCL_NET"] = "AWS Libfabric"
        env["FI_CXI_DISABLE_HOST_REGISTER"] = "1"
        env["NCCL_NET_GDR_LEVEL"] = "PHB" if fab.gpudirect else "LOC"
    else:
        # Plain TCP: no InfiniBand verbs even if a stray HCA is present (NCCL docs).
        env["NCCL_IB_DISABLE"] = "1"
    if cfg.nodes.gpus_per_node and cfg.topology.interconnect == "pcie":
        # Without NVLink, P2P over PCIe across CPU sockets is often slower than via host
        # memory; NCCL_P2P_LEVEL=PXB keeps P2P within a PCIe switch (NCCL docs).
        env["NCCL_P2P_LEVEL"] = "PXB"
    return env


def srun_binding_args(cfg: Config) -> list[str]:
    """srun binding flags matching the node's NUMA layout (only when the preset declares it).

    Devices are not bound here: Slurm with task/none hands every task all GPUs of the node,
    so the worker pins its device from LOCAL_RANK itself.
    """
    if not cfg.nodes.gpus_per_node or not cfg.cluster.numa_domains:
        return []
    return ["--cpu-bind=cores", "--distribution=block:block"]
