"""Network fabric profiles -> the environment block for NCCL, libfabric and gloo (pure).

One profile per ``fabric.kind``. Every default names its source; the order of the block is
stable (bootstrap interface, fabric profile, site extras from ``fabric.env``, whose names
validation checked: ``config.placement_rules``, GPU P2P) so
golden renders stay put. User-set ``launch.env`` always wins: the planner drops every key
of this block that the user set (see ``plan.make_plan``).

Sources, by short name in the comments below:

* NCCL docs: NVIDIA NCCL User Guide, "Environment Variables"
  (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
* NVIDIA RoCE guide: NVIDIA networking docs, "RoCE" / "Default RoCE Mode Setting" and the
  DGX/SuperPOD RoCE deployment guides (GID index 3 = RoCEv2 over IPv4 on mlx5 by default).
* aws-ofi-nccl: github.com/aws/aws-ofi-nccl README and the AWS EFA user guide
  (docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html), plus the settings used by
  aws-samples/awsome-distributed-training.
* NERSC: docs.nersc.gov "Perlmutter: NCCL" (the nccl module's variables);
  OLCF: Frontier user guide, "RCCL / libfabric"; LUMI: docs.lumi-supercomputer.eu.
"""

from __future__ import annotations

from ddlaunch.config.schema import Config
from ddlaunch.planning import topology

# aws-ofi-nccl registers itself with NCCL under this network name.
OFI_NET_NAME = "AWS Libfabric"


def _gdr_level(gpudirect: bool) -> str:
    # NCCL docs, NCCL_NET_GDR_LEVEL: PHB uses GPUDirect RDMA when GPU and NIC share a CPU
    # (through the host bridge), which covers DGX-style and HPE nodes; LOC disables it.
    return "PHB" if gpudirect else "LOC"


def _verbs_env(cfg: Config) -> dict[str, str]:
    """InfiniBand and RoCE: NCCL's own IB verbs transport."""
    fab = cfg.fabric
    env: dict[str, str] = {}
    if fab.hcas:
        # NCCL docs, NCCL_IB_HCA: a leading "=" makes the names exact; without it "mlx5_1"
        # is a prefix and also selects mlx5_10 .. mlx5_17 on nodes with many adapters.
        env["NCCL_IB_HCA"] = "=" + ",".join(fab.hcas)
    # NCCL docs, NCCL_IB_TIMEOUT: 4.096 us * 2^value per retry, default 20; 22 (~17 s) rides
    # out congestion and switch reroutes on large fabrics instead of failing the job.
    env["NCCL_IB_TIMEOUT"] = "22"
    env["NCCL_NET_GDR_LEVEL"] = _gdr_level(fab.gpudirect)
    if fab.kind == "roce":
        if fab.gid_index is not None:
            # NVIDIA RoCE guide: on mlx5, GID index 3 is RoCEv2 over IPv4 by default. When
            # unset, NCCL >= 2.21 selects the RoCEv2 GID itself (NCCL docs, NCCL_IB_GID_INDEX).
            env["NCCL_IB_GID_INDEX"] = str(fab.gid_index)
        if fab.traffic_class is not None:
            # NCCL docs, NCCL_IB_TC: puts NCCL traffic in the lossless (PFC/ECN) class the
            # switches reserve for RoCE; NVIDIA RoCE guides use 106 (DSCP 26, ECN capable).
            env["NCCL_IB_TC"] = str(fab.traffic_class)
    return env


def _efa_env(cfg: Config) -> dict[str, str]:
    """AWS EFA through libfabric and the aws-ofi-nccl plugin."""
    return {
        # aws-ofi-nccl / AWS EFA guide: select libfabric's EFA provider.
        "FI_PROVIDER": "efa",
        # AWS EFA guide: GPUDirect RDMA on instances whose EFA supports RDMA read (p4d, p5);
        # 0 elsewhere, where libfabric would refuse the device.
        "FI_EFA_USE_DEVICE_RDMA": "1" if cfg.fabric.gpudirect else "0",
        # aws-ofi-nccl: data loader workers fork(); libfabric must keep registered memory
        # intact across fork (needed with libfabric < 1.13, harmless after).
        "FI_EFA_FORK_SAFE": "1",
        # aws-samples/awsome-distributed-training and torchtitan's multinode_trainer.slurm:
        # skip CU_POINTER_ATTRIBUTE_SYNC_MEMOPS on registered buffers; NCCL synchronises
        # itself, and FSDP throughput improves.
        "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0",
        # Not set on purpose: NCCL_PROTO=simple. aws-ofi-nccl picks safe protocols per
        # platform itself; forcing simple would switch off LL128 on p5.
    }


def _slingshot_env(cfg: Config) -> dict[str, str]:
    """HPE Slingshot 11 (CXI provider) through libfabric and aws-ofi-nccl."""
    return {
        "FI_PROVIDER": "cxi",
        # NERSC / OLCF: make NCCL (or RCCL) fail loudly if the OFI plugin is not loaded,
        # instead of silently falling back to TCP sockets.
        "NCCL_NET": OFI_NET_NAME,
        "NCCL_NET_GDR_LEVEL": _gdr_level(cfg.fabric.gpudirect),
        # NERSC: Perlmutter nodes have 4 NICs (hsn0-3); let rings and trees use any of them.
        "NCCL_CROSS_NIC": "1",
        # NERSC (nccl module): avoids hangs from CUDA host memory registration in CXI.
        "FI_CXI_DISABLE_HOST_REGISTER": "1",
        # NERSC (nccl module and the SC23 DL tutorial): the memory-registration cache
        # monitor that works with CUDA allocations.
        "FI_MR_CACHE_MONITOR": "userfaultfd",
        # LUMI / OLMo LUMI scripts / OLCF: a larger completion queue avoids "Cassini Event
        # Queue overflow detected" at scale.
        "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    }


def _ethernet_env(cfg: Config) -> dict[str, str]:
    # NCCL docs, NCCL_IB_DISABLE: plain TCP sockets, even if a stray RDMA device is present.
    return {"NCCL_IB_DISABLE": "1"}


def _auto_env(cfg: Config) -> dict[str, str]:
    # Nothing declared: NCCL probes the nodes itself (IB verbs if an HCA is up, else TCP).
    # A guess here would be wrong somewhere: NCCL_IB_DISABLE=1 on an InfiniBand cluster turns
    # its all-reduce into TCP sockets, silently and tens of times slower.
    return {}


_PROFILES = {
    "auto": _auto_env,
    "ib": _verbs_env,
    "roce": _verbs_env,
    "efa": _efa_env,
    "slingshot": _slingshot_env,
    "ethernet": _ethernet_env,
}


def fabric_env(cfg: Config) -> dict[str, str]:
    """Environment block for the configured fabric and GPU topology, in a stable order."""
    fab = cfg.fabric
    env: dict[str, str] = {}
    if fab.interface:
        # Bootstrap/OOB traffic and gloo use plain sockets on this interface (NCCL docs:
        # NCCL_SOCKET_IFNAME is a prefix; PyTorch distributed docs: GLOO_SOCKET_IFNAME needs
        # an exact name, so fabric.interface should be one).
        env["NCCL_SOCKET_IFNAME"] = fab.interface
        env["GLOO_SOCKET_IFNAME"] = fab.interface
    env.update(_PROFILES[fab.kind](cfg))
    env.update(fab.env)
    env.update(topology.p2p_env(cfg))
    return env
