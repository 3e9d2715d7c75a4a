"""Who am I in the job? Environment variables -> ``DistEnv`` (pure, torch-free).

Two sources are understood, checked in this order:

* a local run (``ddlaunch.launch.local``): ``SUBMITIT_EXECUTOR=local`` and submitit's
  ``SUBMITIT_LOCAL_*`` variables (the names of ``submitit.local.local.LocalJobEnvironment``),
  master ``127.0.0.1``;
* a Slurm step task (one srun task per rank): ``SLURM_PROCID``, ``SLURM_LOCALID``,
  ``SLURM_NTASKS``, the node list, the tasks-per-node spec, ``SLURM_RESTART_COUNT``...;
* a rank started by the pod entry of ``--target kubernetes`` (``SUBMITIT_EXECUTOR=kubernetes``):
  the pod's node index (the Job's completion index), the node count, the local rank and node
  0's stable DNS name (``planning.pod_env``), a fixed port (each pod has its own network).

Anything else is a single-process run (rank 0 of 1), which is what calling the rank
function by hand amounts to. ``torchrun_env`` turns the result into the variables a script
written for torchrun reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddlaunch.planning import pod_env
from ddlaunch.planning.ports import master_port_for
from ddlaunch.slurm.hostlist import expand_hostlist, expand_tasks_per_node
from ddlaunch.store.attempts import AttemptId

LOCAL_MASTER_ADDR = "127.0.0.1"
# An explicit port wins over the derived one. Deliberately not plain MASTER_PORT: sbatch
# exports the submitting shell's environment, so a stale MASTER_PORT would leak into jobs.
PORT_OVERRIDE_VAR = "DDLAUNCH_MASTER_PORT"
# Set in a standby process that takes a dead rank's place (fault_tolerance.restart:
# in_process): the process group generation it joins (worker.standby).
REPLACEMENT_VAR = "DDLAUNCH_REPLACEMENT"
# torchrun's default port: a pod's network namespace is its own, so nothing else listens there.
POD_MASTER_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str
    restart_count: int
    relaunch: int = 0  # restarts inside this start of the job ($DDLAUNCH_RELAUNCH)


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    value = _first(environ, *names)
    if value is None:
        if default is None:
            raise ValueError(f"none of {', '.join(names)} is set in the environment")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{names[0]} must be an integer, got {value!r}") from None


def _port(environ: Mapping[str, str], job_id: str, restart_count: int, relaunch: int = 0) -> int:
    if environ.get(PORT_OVERRIDE_VAR):
        return _int(environ, PORT_OVERRIDE_VAR)
    return master_port_for(job_id, restart_count, relaunch)


def _from_submitit_local(environ: Mapping[str, str]) -> DistEnv:
    # One node only (submitit's LocalExecutor refuses nodes > 1): local rank == rank.
    world = _int(environ, "SUBMITIT_LOCAL_NTASKS", default=1)
    rank = _int(environ, "SUBMITIT_LOCAL_GLOBALID", default=0)
    job_id = environ.get("SUBMITIT_LOCAL_JOB_ID", "local")
    restarts = _int(environ, "DDLAUNCH_LOCAL_RESTART_COUNT", default=0)
    return DistEnv(
        rank=rank,
        local_rank=_int(environ, "SUBMITIT_LOCAL_LOCALID", default=rank),
        world_size=world,
        local_world_size=world,
        node_rank=_int(environ, "SUBMITIT_LOCAL_NODEID", default=0),
        num_nodes=_int(environ, "SUBMITIT_LOCAL_JOB_NUM_NODES", default=1),
        master_addr=LOCAL_MASTER_ADDR,
        master_port=_port(environ, job_id, restarts),
        job_id=job_id,
        restart_count=restarts,
    )


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    rank = _int(environ, "SLURM_PROCID")
    world = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    # Step values first: a step may use a subset of the job's nodes.
    num_nodes = _int(
        environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1
    )
    node_rank = _int(environ, "SLURM_NODEID", default=0)
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if not nodelist:
        raise ValueError("no SLURM_STEP_NODELIST / SLURM_JOB_NODELIST: cannot pick MASTER_ADDR")
    # Block distribution (srun's default) puts rank 0 on the first node of the list.
    master = expand_hostlist(nodelist)[0]
    spec = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if spec:
        counts = expand_tasks_per_node(spec)
        local_world = counts[node_rank] if node_rank < len(counts) else counts[-1]
    else:
        local_world = _int(environ, "SLURM_NTASKS_PER_NODE", default=max(1, world // num_nodes))
    # An array task's identity is ARRAYJOB_TASK (what squeue shows and submitit uses); its own
    # SLURM_JOB_ID is a separate number.
    attempt = AttemptId.from_env(environ)
    job_id, restarts = attempt.task or "unknown", attempt.restart
    return DistEnv(
        rank=rank,
        local_rank=_int(environ, "SLURM_LOCALID", default=0),
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master,
        master_port=_port(environ, job_id, restarts, attempt.relaunch),
        job_id=job_id,
        restart_count=restarts,
        relaunch=attempt.relaunch,
    )


def _from_pod(environ: Mapping[str, str]) -> DistEnv:
    pod = pod_env.PodIdentity.from_env(environ)
    local = _int(environ, pod_env.LOCAL_RANK_VAR, default=0)
    attempt = AttemptId.from_env(environ)
    return DistEnv(
        rank=pod.index * pod.ranks_per_node + local,
        local_rank=local,
        world_size=pod.nodes * pod.ranks_per_node,
        local_world_size=pod.ranks_per_node,
        node_rank=pod.index,
        num_nodes=pod.nodes,
        master_addr=pod.master,
        master_port=_int(environ, PORT_OVERRIDE_VAR, default=POD_MASTER_PORT),
        job_id=attempt.task or pod.job,
        restart_count=attempt.restart,
    )


def from_environ(environ: Mapping[str, str]) -> DistEnv:
    """The distributed identity of this process, from its environment."""
    if environ.get("SUBMITIT_EXECUTOR") == "local":
        return _from_submitit_local(environ)
    if environ.get("SUBMITIT_EXECUTOR") == pod_env.EXECUTOR:
        return _from_pod(environ)
    if "SLURM_PROCID" in environ:
        return _from_slurm(environ)
    job_id = environ.get("DDLAUNCH_RUN_ID", "single")
    return DistEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=LOCAL_MASTER_ADDR,
        master_port=_port(environ, job_id, 0),
        job_id=job_id,
        restart_count=0,
    )


def torchrun_env(d: DistEnv) -> dict[str, str]:
    """The variables torchrun gives each worker, so an unmodified torchrun script works."""
    return {
        "RANK": str(d.rank),
        "LOCAL_RANK": str(d.local_rank),
        "WORLD_SIZE": str(d.world_size),
        "LOCAL_WORLD_SIZE": str(d.local_world_size),
        "GROUP_RANK": str(d.node_rank),
        "GROUP_WORLD_SIZE": str(d.num_nodes),
        "NODE_RANK": str(d.node_rank),
        "ROLE_RANK": str(d.rank),
        "ROLE_WORLD_SIZE": str(d.world_size),
        "MASTER_ADDR": d.master_addr,
        "MASTER_PORT": str(d.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(d.restart_count + d.relaunch),
    }


def pick_device(local_rank: int, device_count: int) -> int:
    """The CUDA device index of a rank.

    Normally one device per local rank. When Slurm already narrowed the visible devices to
    one per task (``--gpus-per-task=1``), each task sees its GPU as device 0.
    """
    if device_count <= 0:
        raise ValueError("no CUDA device is visible")
    if local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    raise ValueError(
        f"local rank {local_rank} but only {device_count} CUDA devices are visible "
        "(CUDA_VISIBLE_DEVICES); ask for one GPU per rank"
    )


def choose_backend(configured: str, cuda_available: bool) -> str:
    """launch.backend -> the torch.distributed backend: auto = nccl with CUDA, else gloo."""
    if configured == "auto":
        return "nccl" if cuda_available else "gloo"
    if configured == "nccl" and not cuda_available:
        raise ValueError(
            "launch.backend is nccl but CUDA is not available on this node; use gloo or auto"
        )
    return configured
