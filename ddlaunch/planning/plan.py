"""Config + cluster facts -> LaunchPlan (pure: no I/O, no Slurm calls).

The plan holds everything the template and the submitter need: the ``#SBATCH`` directives,
the sbatch argv, the environment blocks and the srun launch line. ``render`` and ``submit``
both start from it, so a dry run shows exactly what a submission would do.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.schema import Config
from ddlaunch.config.trainers import NO_SIGNAL, is_byo, placeholders, substitute
from ddlaunch.config.validate import parse_duration
from ddlaunch.planning import fabric, topology
from ddlaunch.planning.container import CONCLUDE_ON_HOST_VAR, Mount, container_launch
from ddlaunch.planning.rank_logs import NODE_LOGS, rank_log_layout
from ddlaunch.planning.tracking import tracking_env
from ddlaunch.store.layout import ARRAYS_DIR, CHECKPOINTS_DIR, LOGS_DIR, SCRIPT_FILE, SUBMITIT_DIR

# Only as types, or imported where a plan needs them (submit --after, replica groups):
# ``render`` imports this module, and each module costs it start-up time (policy.chain alone
# builds eight dataclasses).
if TYPE_CHECKING:
    from ddlaunch.planning.components import ComponentsPlan
    from ddlaunch.policy.chain import Edge
    from ddlaunch.slurm.partitions import PartitionFacts


@dataclass(frozen=True)
class ArraySpec:
    """A job array of sweep members: task ``t`` runs member ``members[t]``.

    Array indices are positions in ``members`` (always ``0..len-1``): Slurm caps the highest
    index at MaxArraySize - 1, so a split sweep or a resubmission of scattered members cannot
    use the member numbers themselves as indices. Each member is a normal run directory,
    ``<members_dir>/<member>``, chosen by the script at run time.
    """

    name: str  # the array's script is <run_dir>/arrays/<name>.sbatch
    sweep_id: str
    members: tuple[int, ...]
    members_dir: str
    throttle: int | None = None  # at most this many tasks of the array run at once
    # Checkpoints of member m: <checkpoint_root>/m when storage.checkpoint_dir is set,
    # else <member run dir>/checkpoints.
    checkpoint_root: str | None = None

    @property
    def spec(self) -> str:
        """The ``--array`` value: ``0-N`` plus ``%throttle``."""
        if not self.members:
            raise ValueError("a job array needs at least one member")
        last = len(self.members) - 1
        indices = "0" if last == 0 else f"0-{last}"
        return f"{indices}%{self.throttle}" if self.throttle else indices


@dataclass(frozen=True)
class ClusterFacts:
    """What was probed from the cluster at the edge (all optional: rendering works offline).
    ``partitions``: every partition's nodes and limits (one sinfo call; empty: not probed),
    for ``planning.feasibility``."""

    slurm_version: str | None = None
    max_array_size: int | None = None
    partitions: tuple[PartitionFacts, ...] = ()


@dataclass(frozen=True)
class CodePaths:
    """Where the ranks' code comes from, decided at the edge (``app.snapshot``, ``app.prepare``).

    ``snapshot``: the stored code snapshot the ranks run from (None: the live directory);
    ``workdir``: the ranks' working directory (inside the snapshot when there is one);
    ``ddlaunch_root``: the directory holding the ``ddlaunch`` package that renders the script
    (mounted into a container); ``home``: the user's home (podman's container.mount_home)."""

    snapshot: str | None = None
    workdir: str | None = None
    ddlaunch_root: str | None = None
    home: str | None = None


@dataclass(frozen=True)
class After:
    """``submit --after``'s part of a plan, decided at the edge (``app.chain``): the edges
    onto the predecessors' jobs (joined after ``job.dependency``), and each predecessor's
    run directory for the ranks (``DDLAUNCH_AFTER_<NAME>_DIR``). A resumed dependent keeps
    the directories, not the edges: it waited once already."""

    edges: tuple[Edge, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TrainerStop:
    """The batch shell's part for a trainer that never polls ddlaunch's flag: it gets the
    pre-timeout signal (``--signal=B:...``), forwards ``forward`` to the ranks, waits for the
    save and requeues (``ddlaunch.job.stop``)."""

    kind: str
    batch_signal: str  # what Slurm sends the batch shell (fault_tolerance.signal)
    forward: str  # what the trainer saves on; "none": it is stopped with TERM
    lead: int
    stop_before_limit: bool
    time_limit_s: int  # 0: no limit


@dataclass(frozen=True)
class ReplicaSupervision:
    """fault_tolerance.mode: replica_groups: what the script gives the groups' supervisor
    (``ddlaunch.job.groups``)."""

    groups: int
    nodes_per_group: int
    min_groups: int
    max_restarts: int
    heal_timeout: int
    stale_after: float  # the heartbeats' staleness (policy.heartbeats.Thresholds.stale_after)
    bad_node_ttl_hours: float
    hang_timeout: int = 0  # health.hang_timeout for the per-group hang verdict; 0: off
    heartbeat_interval: float = 10.0
    straggler_factor: float = 2.0
    straggler_patience: int = 300


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    directives: tuple[tuple[str, str | None], ...]
    sbatch_argv: tuple[str, ...]
    ddlaunch_env: tuple[tuple[str, str], ...]
    fabric_env: tuple[tuple[str, str], ...]
    user_env: tuple[tuple[str, str], ...]
    setup: tuple[str, ...]
    srun_argv: tuple[str, ...]
    worker_argv: tuple[str, ...]
    ranks_per_node: int
    world_size: int
    signal: str
    python: str
    array: ArraySpec | None = None  # set for a sweep's job array; run_dir is the sweep dir
    code_dir: str | None = None  # the code snapshot the ranks run from
    pythonpath: str | None = None  # prepended to PYTHONPATH in the script (code, ddlaunch)
    container_runtime: str = "none"
    container_exports: tuple[str, ...] = ()  # shell lines (validated names only)
    mkdirs: tuple[str, ...] = ()  # directories a container mounts, created before srun
    tracking_env: tuple[tuple[str, str], ...] = ()
    # Comment lines of the script: the parallelism placement and the data staging.
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # valid but slow choices, also printed by render/submit
    rank_command: str = ""  # what each rank runs, for the script's comment
    trainer_stop: TrainerStop | None = None
    # Hot spares or nodes.min: the job holds more nodes than the ranks use (--no-kill), and
    # each attempt's step runs on the nodes `hooks place` picks.
    elastic: bool = False
    check_spares: bool = False  # hot spares and health.preflight: the spares are checked too
    replica_groups: ReplicaSupervision | None = None

    # launch.env_from_submit: names only, passed by `sbatch --export`; never their values.
    env_from_submit: tuple[str, ...] = ()
    rank_logs: str = "rank"  # planning.rank_logs: one log file per rank, or per node
    # fault_tolerance.restart: in_process: the standby processes' step (srun, and what each
    # task runs); empty otherwise.
    standby_srun_argv: tuple[str, ...] = ()
    standby_argv: tuple[str, ...] = ()
    standbys_per_node: int = 0
    memory_checkpoint: bool = False  # fault_tolerance.memory_checkpoint: auto, in process
    memory_every_steps: int = 0  # fault_tolerance.memory_every_steps (0: at saves only)
    # components: (a heterogeneous job): the groups of the ranks' step and the services.
    components: ComponentsPlan | None = None

    @property
    def script_path(self) -> str:
        return script_path(self.run_dir, self.array)


def script_path(run_dir: str, array: ArraySpec | None = None) -> str:
    if array is None:
        return str(PurePosixPath(run_dir) / SCRIPT_FILE)
    return str(PurePosixPath(run_dir) / ARRAYS_DIR / f"{array.name}.sbatch")


def sbatch_directives(
    cfg: Config, exclude: Sequence[str] = (), edges: Sequence[Edge] = ()
) -> list[tuple[str, str | None]]:
    """``#SBATCH`` options in a stable order; every value was validated as a Slurm token
    (``edges``: ``--after``'s, made of a Slurm type and a job id sbatch printed). A
    heterogeneous job (``components:``) has a block of node lines per component."""
    out = _directives(cfg, exclude, edges)
    if not cfg.components:
        return out
    from ddlaunch.planning.components import het_directives

    return het_directives(cfg, out)


def _directives(
    cfg: Config, exclude: Sequence[str], edges: Sequence[Edge]
) -> list[tuple[str, str | None]]:
    job, nodes, ft = cfg.job, cfg.nodes, cfg.fault_tolerance
    out: list[tuple[str, str | None]] = [("--job-name", job.name)]
    for flag, value in (
        ("--partition", job.partition),
        ("--account", job.account),
        ("--qos", job.qos),
        ("--reservation", job.reservation),
    ):
        if value:
            out.append((flag, value))
    out.append(("--time", job.time))
    out.append(("--nodes", str(cfg.allocated_nodes)))
    out.append(("--ntasks-per-node", str(cfg.ranks_per_node)))
    if nodes.gpus_per_node:
        out.append(("--gpus-per-node", str(nodes.gpus_per_node)))
    # nodes.cpus_per_task, or a NUMA-aware default where the preset declares CPU binding.
    cpus = topology.cpus_per_task(cfg)
    if cpus:
        out.append(("--cpus-per-task", str(cpus)))
    for flag, value in (
        ("--mem", nodes.mem),
        ("--mem-per-cpu", nodes.mem_per_cpu),
        ("--mem-per-gpu", nodes.mem_per_gpu),
        ("--constraint", job.constraint),
        ("--dependency", _dependency(edges, job.dependency)),
        ("--mail-user", job.mail_user),
        ("--mail-type", job.mail_type),
    ):
        if value:
            out.append((flag, value))
    # --no-kill with spares or nodes.min: Slurm keeps the job when one of its nodes fails,
    # and the ranks restart without it.
    flags = (("--exclusive", job.exclusive), ("--no-kill", cfg.elastic))
    out += [(flag, None) for flag, wanted in flags if wanted]
    excluded = sorted(set(nodes.exclude) | set(exclude))
    if excluded:
        out.append(("--exclude", ",".join(excluded)))
    if nodes.nodelist:
        out.append(("--nodelist", ",".join(nodes.nodelist)))
    # Leaf-switch (--switches) and block/segment (--segment) placement, version-gated.
    out += topology.placement_directives(cfg)
    # Session code: signal the step tasks (not the batch shell) ahead of the time limit; the
    # ranks only set a flag and agree on it at the next step boundary. Other trainers never
    # read that flag: the batch shell gets the signal and asks the trainer (job.stop).
    batch = "B:" if is_byo(cfg.trainer_kind) else ""
    out.append(("--signal", f"{batch}{ft.signal}@{ft.signal_lead}"))
    out.append(("--requeue", None) if job.requeue else ("--no-requeue", None))
    # Keep earlier attempts' output when Slurm requeues the job.
    out.append(("--open-mode", "append"))
    for option, value in cfg.sbatch.items():
        if value is False or value is None:
            continue
        out.append((f"--{option}", None if value is True else str(value)))
    return out


def worker_command(cfg: Config, submitit_folder: str) -> list[str]:
    """What every srun task runs: the pickled rank function, through ddlaunch's equivalent of
    submitit's job runner (``ddlaunch.worker.task``: same files, no submitit import)."""
    return [cfg.launch.python, "-u", "-m", "ddlaunch.worker.task", submitit_folder]


def rank_command(cfg: Config, run_dir: str | None = None) -> str:
    """What each rank runs, as the script's comment says it (``run_dir``: the run's, to
    fill in the placeholders a trainer's arguments may hold; None for an array)."""
    launch = cfg.launch
    if launch.entrypoint:
        return f"{launch.entrypoint}(config) (launch.entrypoint, ddlaunch.train.Session)"
    what = ["-m", launch.module] if launch.module else [str(launch.script)]
    args = list(launch.args)
    if is_byo(cfg.trainer_kind) and run_dir is not None:
        run = PurePosixPath(run_dir)
        own = cfg.trainer.checkpoint_dir
        values = {"run_dir": str(run), "run_id": run.name}
        ckpt = substitute(own, values) if own else cfg.storage.checkpoint_dir
        values["checkpoint_dir"] = ckpt or str(run / CHECKPOINTS_DIR)
        args = [substitute(word, values) for word in args]
    line = format_argv([launch.python, *what, *args])
    if is_byo(cfg.trainer_kind) and run_dir is None and any(map(placeholders, args)):
        line += " [{placeholders} filled in per member]"
    layout = cfg.trainer_layout
    if is_byo(cfg.trainer_kind) and layout.resume_args:
        line += " [+ " + format_argv(layout.resume_args) + " once a checkpoint exists]"
    return line


def trainer_stop(cfg: Config) -> TrainerStop | None:
    if not is_byo(cfg.trainer_kind):
        return None
    return TrainerStop(
        kind=cfg.trainer_kind,
        batch_signal=cfg.fault_tolerance.signal,
        forward=cfg.trainer_layout.signal or NO_SIGNAL,
        lead=cfg.fault_tolerance.signal_lead,
        stop_before_limit=cfg.trainer.stop_before_limit,
        time_limit_s=parse_duration(cfg.job.time) or 0,
    )


def make_plan(
    cfg: Config,
    *,
    run_id: str,
    run_dir: str,
    workdir: str,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
    array: ArraySpec | None = None,
    code: CodePaths | None = None,
    after: After | None = None,
) -> LaunchPlan:
    """The plan of one run, or (``array``) of a job array whose tasks are sweep members;
    then ``run_dir`` is the sweep directory and each task picks its member at run time.
    ``code``: the ranks' code snapshot (default: the live ``launch.workdir`` or ``workdir``);
    ``after``: the runs it is submitted after (``submit --after``)."""
    facts = facts or ClusterFacts()
    after = after or After()
    code = code or CodePaths()
    if cfg.container.image and cfg.container.runtime == "none":
        # Valid for the kubernetes target (the image alone); on Slurm the image needs a runtime.
        message = "container.image is set but runtime is none (pyxis, apptainer or podman)"
        raise ConfigError([ConfigIssue("container.runtime", message)])
    ranks_dir = code.workdir or cfg.launch.workdir or workdir
    run = PurePosixPath(run_dir)
    logs = run / LOGS_DIR
    submission: tuple[str, ...]
    rank_logs: tuple[str, ...]
    layout = rank_log_layout(cfg)
    if array is None:
        submission = (f"--output={logs / 'batch-%j.out'}",)
        # One run: rank logs go straight to its run directory.
        name = "node-%N" if layout == NODE_LOGS else "rank-%t"
        rank_logs = (f"--output={logs / (name + '.out')}", f"--error={logs / (name + '.err')}")
    else:
        if facts.max_array_size is not None and len(array.members) > facts.max_array_size:
            raise ValueError(
                f"array {array.name} has {len(array.members)} tasks but the cluster's "
                f"MaxArraySize is {facts.max_array_size}"
            )
        # Only what the script prints before it switches to the member's own batch log.
        submission = (f"--array={array.spec}", f"--output={logs / 'batch-%A_%a.out'}")
        # The member is known only at run time: the script points srun at the member's
        # logs through SLURM_STDOUTMODE / SLURM_STDERRMODE, which srun reads when the
        # command line has no --output / --error.
        rank_logs = ()
    # sbatch takes each named variable's value from its own environment: the values never
    # reach the script, the run directory or the intent record (which keeps this argv).
    passed = cfg.launch.env_from_submit
    export = (f"--export={','.join(('ALL', *passed))}",) if passed else ()
    sbatch_argv = (
        "sbatch",
        "--parsable",
        *submission,
        *export,
        f"--chdir={ranks_dir}",
        script_path(run_dir, array),
    )
    parts = _components(cfg, run)
    if parts is not None and array is not None:
        message = "a sweep of heterogeneous jobs is not supported yet: submit each member"
        raise ConfigError([ConfigIssue("components", message)])
    if parts is not None:
        rank_logs = parts.train_srun_args
    srun_argv = (
        "srun",
        # One file per node: srun --label prefixes each line with its rank, and slurmstepd
        # reads the ranks' output from pipes, line by line (--unbuffered would give them a
        # pty and label every fragment a read returns). One file per rank: slurmstepd makes
        # the file itself each task's stdout, and --unbuffered changes nothing there.
        *(("--label",) if layout == NODE_LOGS or parts else ("--unbuffered",)),
        # One failed rank ends the step. Not for replica groups: their supervisor ends a
        # failed group's step itself, at once (``job.groups.group_srun`` says why).
        # Nor for the in-process restart: the survivors go on while a standby takes the
        # dead rank's place.
        "--kill-on-bad-exit=0"
        if cfg.fault_tolerance.mode == "replica_groups"
        or cfg.fault_tolerance.restart == "in_process"
        else "--kill-on-bad-exit=1",
        f"--ntasks-per-node={cfg.ranks_per_node}",
        *rank_logs,
        *topology.srun_binding_args(cfg),
        *_rank_order_args(cfg),
    )
    env = fabric.fabric_env(cfg)
    fabric_env = tuple((k, v) for k, v in env.items() if k not in cfg.launch.env)
    tracking = tracking_env(cfg, run_id if array is None else array.sweep_id)
    ours: dict[str, str] = {}
    if array is None:
        # (An array task exports its member's checkpoint directory itself.)
        ours["DDLAUNCH_CHECKPOINT_DIR"] = cfg.storage.checkpoint_dir or str(run / CHECKPOINTS_DIR)
    if cfg.storage.scratch:
        ours["DDLAUNCH_SCRATCH"] = cfg.storage.scratch
    ours.update(after.env)
    if parts is not None:
        ours[parts.train_ranks_var] = parts.train_ranks
    in_container = cfg.container.runtime != "none"
    if in_container:
        ours[CONCLUDE_ON_HOST_VAR] = "1"
    paths = [p for p in (code.snapshot, code.ddlaunch_root if in_container else None) if p]
    pythonpath = ":".join(dict.fromkeys(paths)) or None
    mounts, mkdirs = _container_mounts(cfg, run, array, code, ranks_dir)
    launch = container_launch(
        cfg,
        mounts=mounts,
        workdir=cfg.container.workdir or ranks_dir,
        env_names=[*(k for k, _ in fabric_env), *cfg.launch.env, *(k for k, _ in tracking)],
        pythonpath=pythonpath,
        home=code.home,
    )
    return LaunchPlan(
        run_id=run_id,
        run_dir=str(run),
        directives=tuple(sbatch_directives(cfg, exclude, after.edges)),
        sbatch_argv=sbatch_argv,
        ddlaunch_env=tuple(ours.items()),
        fabric_env=fabric_env,
        user_env=tuple(cfg.launch.env.items()),
        setup=cfg.launch.setup,
        srun_argv=(*srun_argv, *launch.srun_args),
        worker_argv=(*launch.prefix, *worker_command(cfg, str(run / SUBMITIT_DIR))),
        ranks_per_node=cfg.ranks_per_node,
        world_size=cfg.world_size,
        signal=cfg.fault_tolerance.signal,
        python=cfg.launch.python,
        array=array,
        code_dir=code.snapshot,
        pythonpath=pythonpath,
        container_runtime=cfg.container.runtime,
        elastic=cfg.elastic,
        check_spares=cfg.fault_tolerance.spare_nodes > 0 and cfg.health.preflight,
        replica_groups=replica_groups(cfg),
        container_exports=launch.exports,
        mkdirs=tuple(mkdirs) if in_container else (),
        tracking_env=tracking,
        rank_command=rank_command(cfg, None if array else str(run)),
        trainer_stop=trainer_stop(cfg),
        **_notes(cfg),
        env_from_submit=tuple(passed),
        rank_logs=layout,
        **_standbys(cfg, run, launch.prefix, launch.srun_args, array),
        standbys_per_node=(
            cfg.fault_tolerance.standbys_per_node
            if cfg.fault_tolerance.restart == "in_process"
            else 0
        ),
        memory_checkpoint=cfg.fault_tolerance.restart == "in_process"
        and cfg.fault_tolerance.memory_checkpoint == "auto",
        memory_every_steps=cfg.fault_tolerance.memory_every_steps,
        components=parts,
    )


def _standbys(
    cfg: Config,
    run: PurePosixPath,
    prefix: tuple[str, ...],
    container_args: tuple[str, ...],
    array: ArraySpec | None,
) -> dict[str, tuple[str, ...]]:
    """The standby step of ``fault_tolerance.restart: in_process``: beside the ranks, on
    their nodes, ``standbys_per_node`` processes each (``ddlaunch.worker.standby``), sharing
    the ranks' resources (--overlap); their output in ``logs/standby-<node>-<task>``."""
    ft = cfg.fault_tolerance
    if ft.restart != "in_process":
        return {}
    logs = run / LOGS_DIR
    output = (
        ()
        if array is not None
        else (
            f"--output={logs / 'standby-%N-%t.out'}",
            f"--error={logs / 'standby-%N-%t.err'}",
        )
    )
    # The task count, else srun takes the job's (the ranks'); a job with spares or nodes.min
    # gives its step's nodes in the script.
    count = () if cfg.elastic else (f"--nodes={cfg.nodes.count}",)
    tasks = () if cfg.elastic else (f"--ntasks={cfg.nodes.count * ft.standbys_per_node}",)
    # With hot spares the job is --no-kill; so must its standbys' step be, or Slurm ends it
    # when one of its nodes dies (the control store with it).
    keep = ("--no-kill",) if cfg.elastic else ()
    srun = (
        "srun",
        "--overlap",
        "--kill-on-bad-exit=0",
        *keep,
        *count,
        *tasks,
        f"--ntasks-per-node={ft.standbys_per_node}",
        *output,
        *container_args,
    )
    command = (
        *prefix,
        cfg.launch.python,
        "-u",
        "-m",
        "ddlaunch.worker.standby",
        str(run / SUBMITIT_DIR),
    )
    return {"standby_srun_argv": srun, "standby_argv": command}


def _components(cfg: Config, run: PurePosixPath) -> ComponentsPlan | None:
    """``planning.components``, imported only for a heterogeneous job."""
    if not cfg.components:
        return None
    from ddlaunch.planning.components import plan_components

    return plan_components(cfg, run)


def _container_mounts(
    cfg: Config, run: PurePosixPath, array: ArraySpec | None, code: CodePaths, ranks_dir: str
) -> tuple[list[Mount], list[str]]:
    """What a container needs mounted at its own path, and the directories among them that
    may not exist yet when the job starts (a bind mount needs its source)."""
    mounts = [Mount(str(run))]
    mkdirs = []
    ckpt = cfg.storage.checkpoint_dir or (array.checkpoint_root if array else None)
    if ckpt and not PurePosixPath(ckpt).is_relative_to(run):
        mounts.append(Mount(ckpt))
        mkdirs.append(ckpt)
    if cfg.storage.scratch:
        mounts.append(Mount(cfg.storage.scratch))
        mkdirs.append(cfg.storage.scratch)
    # The code, read-only: one snapshot serves many runs. Without one, the live directory.
    mounts.append(Mount(code.snapshot, read_only=True) if code.snapshot else Mount(ranks_dir))
    if code.ddlaunch_root:
        mounts.append(Mount(str(PurePosixPath(code.ddlaunch_root) / "ddlaunch"), read_only=True))
    return mounts, mkdirs


def _notes(cfg: Config) -> dict[str, tuple[str, ...]]:
    """What the script says about the parallelism plan and the data staging, and the plan's
    warnings; ``describe`` is imported only for configs that have either."""
    if not cfg.parallel.configured and not cfg.storage.stage:
        return {}
    from ddlaunch.planning import describe

    return {
        "notes": (*describe.parallel_lines(cfg), *describe.staging_lines(cfg)),
        "warnings": tuple(describe.warnings(cfg)),
    }


def _rank_order_args(cfg: Config) -> list[str]:
    """A parallelism plan places ranks node by node (``planning.parallel.rank_of``): say so
    to srun, whose default a SLURM_DISTRIBUTION in the submitting shell could change.
    CPU binding passes --distribution=block:block already."""
    if cfg.parallel.configured and not cfg.cluster.cpu_binding:
        return ["--distribution=block"]
    return []


def _dependency(edges: Sequence[Edge], configured: str | None) -> str | None:
    """``policy.chain.dependency``, imported only when there are ``--after`` edges: without
    them the value is ``job.dependency`` as configured."""
    if not edges:
        return configured or None
    from ddlaunch.policy.chain import dependency

    return dependency(edges, configured)


def format_argv(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def replica_groups(cfg: Config) -> ReplicaSupervision | None:
    """The groups of a replica_groups config (validation made nodes.count divisible)."""
    ft = cfg.fault_tolerance
    if ft.mode != "replica_groups":
        return None
    from ddlaunch.config.parallel import degrees_of  # only replica groups need the degrees

    groups = degrees_of(cfg).dp_replicate
    return ReplicaSupervision(
        groups=groups,
        nodes_per_group=cfg.nodes.count // max(groups, 1),
        min_groups=ft.min_replica_groups,
        max_restarts=ft.max_restarts,
        heal_timeout=ft.heal_timeout,
        stale_after=3 * cfg.health.heartbeat_interval + 5,
        bad_node_ttl_hours=cfg.health.bad_node_ttl_hours,
        # health.watchdog off: no hang verdict, as in mode: job.
        hang_timeout=cfg.health.hang_timeout if cfg.health.watchdog else 0,
        heartbeat_interval=cfg.health.heartbeat_interval,
        straggler_factor=cfg.health.straggler_factor,
        straggler_patience=cfg.health.straggler_patience,
    )
