"""The config schema: typed, frozen sections, one documented field per YAML key.

Each field's ``metadata`` carries its one-line ``doc`` (used by ``ddlaunch config-reference``
and the README) and the checks applied by ``ddlaunch.config.validate``: ``choices``,
``range`` (inclusive), ``pattern`` (a name from ``PATTERNS``) and ``parse`` (a parser name).
Cross-field rules (contradictions) live in ``validate.check_contradictions``. The larger
sections have a module each, named after the section (``fault_tolerance``, ``health``,
``kubernetes``, ``trainer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddlaunch.config.balance import BalanceSpec
from ddlaunch.config.components import ComponentSpec
from ddlaunch.config.fault_tolerance import FaultToleranceSpec, can_leave_out
from ddlaunch.config.fields import PATTERNS, opt
from ddlaunch.config.health import HealthSpec
from ddlaunch.config.kubernetes import KubernetesSpec
from ddlaunch.config.trainer import TrainerSpec
from ddlaunch.config.trainers import LAYOUT_KEYS, Layout, default_kind, resolve

__all__ = ["PATTERNS", "Config", "FaultToleranceSpec", "HealthSpec", "KubernetesSpec", "opt"]


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    name: str = opt(
        "ddlaunch", "Slurm job name (--job-name); the run id starts with it.", pattern="name"
    )
    partition: str | None = opt(
        None,
        "Partition to submit to; when unset, sbatch's own default: $SBATCH_PARTITION from your "
        "shell, else the cluster's default partition (submit checks the job against that one).",
        pattern="slurm_token",
    )
    account: str | None = opt(None, "Account to charge (--account).", pattern="slurm_token")
    qos: str | None = opt(None, "Quality of service (--qos).", pattern="slurm_token")
    time: str = opt(
        "01:00:00", "Time limit as a Slurm duration: MM, HH:MM:SS, D-HH:MM, ...", parse="duration"
    )
    reservation: str | None = opt(
        None, "Reservation to run in (--reservation).", pattern="slurm_token"
    )
    constraint: str | None = opt(
        None, "Node feature constraint (--constraint).", pattern="constraint"
    )
    exclusive: bool = opt(False, "Ask for whole nodes (--exclusive).")
    dependency: str | None = opt(
        None, "Job dependency, e.g. afterok:1234 (--dependency).", pattern="slurm_token"
    )
    mail_user: str | None = opt(
        None, "Address for Slurm mail (--mail-user).", pattern="slurm_token"
    )
    mail_type: str | None = opt(
        None,
        "Events to mail about: NONE, BEGIN, END, FAIL, REQUEUE, ALL (comma-separated).",
        parse="mail_type",
    )
    requeue: bool = opt(
        True,
        "Let Slurm requeue the job on node failure or preemption (never when "
        "fault_tolerance.max_requeues is 0: the job is submitted with --no-requeue).",
    )


@dataclass(frozen=True, kw_only=True)
class NodesSpec:
    count: int = opt(1, "Number of nodes the ranks run on (--nodes).", range=(1, 100000))
    min: int | None = opt(
        None,
        "Fewest nodes to continue on after nodes failed and no spare is left: the job "
        "restarts inside its allocation on the nodes still usable (at least this many; the "
        "world size and global batch shrink, resharded from the checkpoint) instead of "
        "requeueing. null: never shrink.",
        range=(1, 100000),
    )
    gpus_per_node: int = opt(0, "GPUs per node; one rank is started per GPU.", range=(0, 16))
    tasks_per_node: int | None = opt(
        None, "Ranks per node when there are no GPUs (CPU training).", range=(1, 512)
    )
    cpus_per_task: int | None = opt(None, "CPU cores per rank (--cpus-per-task).", range=(1, 1024))
    mem: str | None = opt(
        None, "Memory per node, e.g. 256G; 0 means all (--mem).", pattern="memory"
    )
    mem_per_cpu: str | None = opt(None, "Memory per CPU core (--mem-per-cpu).", pattern="memory")
    mem_per_gpu: str | None = opt(None, "Memory per GPU (--mem-per-gpu).", pattern="memory")
    exclude: tuple[str, ...] = opt([], "Nodes never to use (--exclude).", pattern="slurm_token")
    nodelist: tuple[str, ...] = opt([], "Nodes to use (--nodelist).", pattern="slurm_token")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str = opt("generic", "Name of the cluster or node type this preset describes.")
    description: str = opt("", "One line shown by `ddlaunch presets`.")
    gpus_per_node: int | None = opt(
        None,
        "GPUs a node of this cluster has (upper bound for nodes.gpus_per_node).",
        range=(0, 16),
    )
    cpus_per_node: int | None = opt(
        None,
        "CPUs a node offers to jobs, as Slurm counts them (cores, or threads with SMT).",
        range=(1, 4096),
    )
    numa_domains: int | None = opt(
        None,
        "NUMA domains per node; the default per-rank CPU count keeps each rank in one.",
        range=(1, 64),
    )
    slurm_version: str | None = opt(
        None,
        "Slurm release of the cluster, e.g. 23.11 (gates version-specific options).",
        parse="version",
    )
    cpu_binding: bool = opt(
        False,
        "Slurm binds tasks to cores here (task/affinity or task/cgroup): enables srun "
        "--cpu-bind/--distribution and a per-rank CPU default. False for task/none.",
    )
    gpu_binding: bool = opt(
        False,
        "Slurm knows each GPU's CPU affinity here (gres.conf Cores= or AutoDetect=nvml): "
        "enables srun --gpu-bind. False for fake or unbound GPUs.",
    )
    topology_plugin: str | None = opt(
        None,
        "Slurm TopologyPlugin: flat (topology/none or flat), tree or block; block enables "
        "topology.segment.",
        choices=("flat", "tree", "block"),
    )


@dataclass(frozen=True, kw_only=True)
class TopologySpec:
    gpu_model: str | None = opt(None, "GPU model, e.g. H100-SXM (informational, shown by status).")
    interconnect: str = opt(
        "auto",
        "How GPUs in a node talk: nvswitch, nvlink or pcie; auto sets no NCCL_P2P_LEVEL and "
        "leaves the choice to NCCL.",
        choices=("auto", "nvswitch", "nvlink", "pcie"),
    )
    switches: int | None = opt(
        None, "Ask Slurm for at most this many leaf switches (--switches).", range=(1, 1024)
    )
    switch_wait: str | None = opt(
        None, "How long to wait for the switch count (duration).", parse="duration"
    )
    segment: int | None = opt(
        None,
        "Nodes per segment, each segment inside one topology/block block (--segment; "
        "Slurm >= 24.05, cluster.topology_plugin: block).",
        range=(1, 100000),
    )


@dataclass(frozen=True, kw_only=True)
class FabricSpec:
    kind: str = opt(
        "auto",
        "Network fabric: ib, roce, efa, slingshot or ethernet; auto exports no fabric variable "
        "and lets NCCL choose (`ddlaunch doctor` says what the nodes have).",
        choices=("auto", "ib", "roce", "efa", "slingshot", "ethernet"),
    )
    hcas: tuple[str, ...] = opt(
        [],
        "Host channel adapters for NCCL_IB_HCA, exact names (optionally :port), "
        "e.g. [mlx5_0, mlx5_1].",
        pattern="slurm_token",
    )
    interface: str | None = opt(
        None,
        "Network interface for bootstrap traffic (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).",
        pattern="slurm_token",
    )
    gid_index: int | None = opt(
        None,
        "RoCE GID index (NCCL_IB_GID_INDEX); unset lets NCCL >= 2.21 pick the RoCEv2 GID.",
        range=(0, 255),
    )
    traffic_class: int | None = opt(None, "RoCE traffic class (NCCL_IB_TC).", range=(0, 255))
    gpudirect: bool = opt(True, "Use GPUDirect RDMA where the fabric supports it.")
    env: dict[str, str] = opt(
        {},
        "Site-specific fabric variables (usually from a cluster preset), exported after the "
        "profile's defaults; launch.env still wins.",
    )


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    name: str | None = opt(None, "Data set name: $DDLAUNCH_DATA_<NAME>.", pattern="data_name")
    src: str | None = opt(None, "Absolute path of the data (file or directory), shared filesystem.")
    dst: str | None = opt(
        None, "Absolute node-local copy ({node}: hostname); default <scratch>/data/<name>-<hash>."
    )
    mode: str = opt(
        "copy",
        "copy (what changed, in threads), rsync (rsync -a --delete), sbcast (one file, broadcast).",
        choices=("copy", "rsync", "sbcast"),
    )


@dataclass(frozen=True, kw_only=True)
class StorageSpec:
    run_root: str = opt(
        "~/ddlaunch/runs",
        "Where run directories are created (shared "
        "filesystem); $DDLAUNCH_RUN_ROOT overrides the default.",
    )
    checkpoint_dir: str | None = opt(
        None, "Absolute checkpoint directory; default <run dir>/checkpoints."
    )
    scratch: str | None = opt(
        None, "Node-local scratch directory, $DDLAUNCH_SCRATCH; {node}: the node's hostname."
    )
    stage: tuple[StageSpec, ...] = opt(
        [], "Data copied to node-local storage, what changed, once per node before the first step."
    )
    rank_logs: str = opt(
        "auto",
        "The ranks' stdout/stderr files: rank (logs/rank-<R>.out|.err), node (one "
        "logs/node-<host>.out|.err per node, each line labelled with its rank by srun "
        "--label; `logs --rank N` shows rank N's lines) or auto: node above 128 ranks. "
        "Replica groups always write one file per rank.",
        choices=("auto", "rank", "node"),
    )
    ranks_listed: int = opt(
        100,
        "Ranks named in each crashed attempt's record in attempts.json (the ranks that "
        "ended and the causes, culprit first); the rest are counted. 100: every rank of a "
        "job below 100 ranks is named; at 16,000 ranks a record stays ~30 KB, not 5 MB.",
        range=(1, 10**6),
    )


def degree(doc: str) -> Any:
    """A parallelism degree: a positive integer, ``auto`` (what the others leave), or unset."""
    return opt(None, doc, parse="degree", type_label="int, auto or null")


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    dp: int | str | None = degree("Data-parallel degree, dp_replicate x dp_shard (unset: auto).")
    dp_shard: int | str | None = degree("FSDP shard degree inside dp (unset: dp / dp_replicate).")
    dp_replicate: int | str | None = degree("Replicas of the sharded model, HSDP (unset: 1).")
    tp: int | str | None = degree("Tensor-parallel degree; a group lives on one node (unset: 1).")
    pp: int | str | None = degree("Pipeline stages, each on whole nodes (unset: 1).")
    cp: int | str | None = degree("Context-parallel degree; cp x tp fits in one node (unset: 1).")
    model_params: float | None = opt(
        None, "Model parameters (e.g. 7e9), for the communication estimate.", range=(1, 1e15)
    )
    dtype_bytes: int = opt(2, "Bytes per value communicated (2: bf16, 4: fp32).", range=(1, 8))
    hidden_size: int | None = opt(None, "Model width (tp/cp/pp traffic).", range=(1, 10**7))
    layers: int | None = opt(None, "Transformer layers (tp/cp/pp traffic).", range=(1, 10**5))
    tokens_per_step: int | None = opt(
        None, "Tokens per optimizer step, whole job (tp/cp/pp traffic).", range=(1, 10**13)
    )
    intra_node_gbps: float | None = opt(
        None, "GPU-GPU Gbit/s per GPU inside a node (default: nominal).", range=(0.001, 1e6)
    )
    inter_node_gbps: float | None = opt(
        None, "Network Gbit/s per node (default: nominal for fabric.kind).", range=(0.001, 1e6)
    )

    @property
    def configured(self) -> bool:
        """Whether any degree was set: only then is the plan printed and checked."""
        return any(
            getattr(self, k) is not None
            for k in ("dp", "dp_shard", "dp_replicate", "tp", "pp", "cp")
        )


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    entrypoint: str | None = opt(
        None,
        "Python callable pkg.module:function; it receives the resolved config.",
        pattern="entrypoint",
    )
    script: str | None = opt(None, "Path of a training script written for torchrun.")
    module: str | None = opt(
        None,
        "Python module run as python -m MODULE ARGS (torchrun -m), e.g. a trainer's CLI.",
        pattern="module",
    )
    args: tuple[str, ...] = opt([], "Arguments for the script.")
    python: str = opt("python3", "Python interpreter on the compute nodes.")
    env: dict[str, str] = opt(
        {}, "Environment variables for every rank (they win over fabric defaults)."
    )
    env_from_submit: tuple[str, ...] = opt(
        [],
        "Variables passed by name from the submitting shell to the job (sbatch --export), "
        "e.g. tokens: their values are never written into the run directory or the script.",
        pattern="env_name",
    )
    setup: tuple[str, ...] = opt(
        [],
        "Shell lines run verbatim in the batch script before launch "
        "(module load, conda activate...).",
    )
    backend: str = opt(
        "auto",
        "torch.distributed backend: auto (nccl with CUDA, else gloo), nccl or gloo.",
        choices=("auto", "nccl", "gloo"),
    )
    workdir: str | None = opt(
        None, "Working directory of the ranks; default the directory `submit` ran in."
    )
    snapshot: str = opt(
        "auto",
        "Code the ranks run from: git (the work tree's tracked files plus uncommitted "
        "changes), copy (the directory, less snapshot_ignore), none (the live directory); "
        "auto: git in a git work tree, else none. Stored once per content hash.",
        choices=("auto", "git", "copy", "none"),
    )
    snapshot_ignore: tuple[str, ...] = opt(
        [".git", "__pycache__", "*.pyc", ".venv", "venv", "*.egg-info", ".mypy_cache"],
        "Glob patterns (matched against every file and directory name) left out of a copy "
        "snapshot; the run root is always left out.",
    )


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    runtime: str = opt(
        "none",
        "Run the ranks in a container: pyxis (srun --container-image), apptainer or "
        "singularity (apptainer exec), podman (podman run), none. Hooks, scontrol and the "
        "watchdog stay on the host.",
        choices=("none", "pyxis", "apptainer", "singularity", "podman"),
    )
    image: str | None = opt(
        None,
        "Image: a registry reference (nvcr.io/nvidia/pytorch:24.05-py3, docker://...), or "
        "an absolute path to a .sif or .sqsh file. --target kubernetes pulls it (a registry "
        "reference; runtime does not matter there).",
    )
    mounts: tuple[str, ...] = opt(
        [],
        "More bind mounts, src:dst[:flags] with absolute paths (flags joined by +, e.g. "
        "ro); the run, checkpoint and code directories are mounted at their own paths anyway.",
    )
    workdir: str | None = opt(None, "Working directory in the container (absolute path).")
    env: tuple[str, ...] = opt(
        [],
        "Names of more environment variables to pass into the container (ddlaunch's, "
        "Slurm's, the fabric's, launch.env and tracking variables always are).",
        pattern="env_name",
    )
    mount_home: bool = opt(False, "Mount $HOME into the container (pyxis, apptainer would).")
    extra_args: tuple[str, ...] = opt(
        [],
        "More runtime arguments, verbatim: srun's for pyxis, apptainer exec's, podman run's.",
    )


@dataclass(frozen=True, kw_only=True)
class TrackingSpec:
    wandb: bool = opt(
        False,
        "Export WANDB_RUN_ID (the run id, stable across requeues and restarts) and "
        "WANDB_RESUME=allow: one W&B run spans every attempt.",
    )


@dataclass(frozen=True, kw_only=True)
class TemplatesSpec:
    search_path: tuple[str, ...] = opt(
        [],
        "Directories searched for templates before $DDLAUNCH_TEMPLATE_PATH and the built-in ones.",
    )
    main: str = opt(
        "sbatch.sh.j2", "Template rendered into the batch script.", pattern="template_name"
    )


@dataclass(frozen=True, kw_only=True)
class Config:
    job: JobSpec = field(default_factory=JobSpec, metadata={"doc": "Slurm job settings."})
    nodes: NodesSpec = field(default_factory=NodesSpec, metadata={"doc": "What to allocate."})
    components: tuple[ComponentSpec, ...] = opt(
        [],
        "A job over unlike nodes (a Slurm heterogeneous job): each component's nodes, and "
        "its role (train: one world over every train component; service: its own program).",
    )
    cluster: ClusterSpec = field(
        default_factory=ClusterSpec, metadata={"doc": "Facts about the cluster (usually a preset)."}
    )
    topology: TopologySpec = field(
        default_factory=TopologySpec, metadata={"doc": "GPU topology inside a node and placement."}
    )
    fabric: FabricSpec = field(
        default_factory=FabricSpec, metadata={"doc": "Network fabric between nodes."}
    )
    storage: StorageSpec = field(
        default_factory=StorageSpec,
        metadata={"doc": "Run directory, checkpoints, scratch, data staging."},
    )
    parallel: ParallelSpec = field(
        default_factory=ParallelSpec,
        metadata={"doc": "Parallelism plan: degrees, placement, communication estimate."},
    )
    fault_tolerance: FaultToleranceSpec = field(
        default_factory=FaultToleranceSpec,
        metadata={"doc": "Checkpoint cadence, retention, requeue and signal."},
    )
    health: HealthSpec = field(
        default_factory=HealthSpec,
        metadata={"doc": "Node preflight checks, heartbeats, hang and straggler watchdog."},
    )
    launch: LaunchSpec = field(
        default_factory=LaunchSpec, metadata={"doc": "What every rank runs."}
    )
    container: ContainerSpec = field(
        default_factory=ContainerSpec,
        metadata={"doc": "A container for the ranks (only the rank command runs inside)."},
    )
    tracking: TrackingSpec = field(
        default_factory=TrackingSpec,
        metadata={"doc": "Experiment trackers that must see one run across requeues."},
    )
    trainer: TrainerSpec = field(
        default_factory=TrainerSpec,
        metadata={"doc": "The trainer's own checkpoints, resume arguments and stop signal."},
    )
    kubernetes: KubernetesSpec = field(
        default_factory=KubernetesSpec,
        metadata={"doc": "The Kubernetes target (render/submit --target kubernetes)."},
    )
    balance: BalanceSpec = field(
        default_factory=BalanceSpec,
        metadata={"doc": "Splitting the global batch over unlike GPUs (by measured throughput)."},
    )
    templates: TemplatesSpec = field(
        default_factory=TemplatesSpec, metadata={"doc": "Site template search path."}
    )
    sbatch: dict[str, Any] = opt(
        {}, "Extra sbatch directives the model does not know, as option: value (true for a flag)."
    )
    params: dict[str, Any] = opt(
        {},
        "Free-form parameters for the training code "
        "(learning rate, steps, ...), passed through unchecked.",
    )

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU; CPU jobs use nodes.tasks_per_node (default 1)."""
        if self.nodes.gpus_per_node:
            return self.nodes.gpus_per_node
        return self.nodes.tasks_per_node or 1

    @property
    def trainer_layout(self) -> Layout:
        """The trainer's checkpoint layout: its kind's, with the section's own values."""
        t = self.trainer
        return resolve(self.trainer_kind, {k: getattr(t, k, None) for k in LAYOUT_KEYS})

    @property
    def trainer_kind(self) -> str:
        """``trainer.kind``, or its default for the launch (validation fills it in)."""
        return self.trainer.kind or default_kind(self.launch.entrypoint)

    @property
    def world_size(self) -> int:
        return self.nodes.count * self.ranks_per_node

    @property
    def allocated_nodes(self) -> int:
        """Nodes the job holds: the ranks' nodes and the hot spares."""
        return self.nodes.count + self.fault_tolerance.spare_nodes

    @property
    def elastic(self) -> bool:
        """Whether a failed node can be left out inside the allocation (--no-kill); with
        replica groups always: a dead node costs its group, never the job."""
        n, ft = self.nodes, self.fault_tolerance
        return ft.mode == "replica_groups" or can_leave_out(n.count, n.min, ft.spare_nodes)
