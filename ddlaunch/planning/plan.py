"""Config + cluster facts -> LaunchPlan (pure: no I/O, no Slurm calls).

The plan holds everything the template and the submitter need: the ``#SBATCH`` directives,
the sbatch argv, the environment blocks and the srun launch line. ``render`` and ``submit``
both start from it, so a dry run shows exactly what a submission would do.

``make_plan`` only plans: every caller validated its config (``config.validate``, and for the
Slurm target ``config.slurm_target``). The plan's parts live by meaning: the inputs decided
at the edge (``planning.inputs``), the ``#SBATCH`` lines (``planning.directives``), the ranks'
step (``planning.rank_step``), and what is said about the plan rather than run
(``planning.about``, worked out only where shown). This module owns the plan's value, its
launch mode (``LaunchPlan.mode``, which picks the script's mode partial) and what the batch
shell is given for a trainer's stop and for replica groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from ddlaunch.config.schema import Config
from ddlaunch.config.trainers import NO_SIGNAL, is_byo
from ddlaunch.config.validate import parse_duration
from ddlaunch.planning import fabric, topology
from ddlaunch.planning.about import About
from ddlaunch.planning.container import CONCLUDE_ON_HOST_VAR, Mount, container_launch
from ddlaunch.planning.directives import sbatch_directives
from ddlaunch.planning.inputs import After, ArraySpec, ClusterFacts, CodePaths
from ddlaunch.planning.rank_logs import NODE_LOGS, rank_log_layout
from ddlaunch.planning.rank_step import format_argv, rank_order_args, standbys, worker_command
from ddlaunch.planning.tracking import tracking_env
from ddlaunch.store.layout import ARRAYS_DIR, CHECKPOINTS_DIR, LOGS_DIR, SCRIPT_FILE, SUBMITIT_DIR

# Only as a type, imported where a plan needs it: ``render`` imports this module, and each
# module costs it start-up time.
if TYPE_CHECKING:
    from ddlaunch.planning.components import ComponentsPlan

# The plan's inputs and helpers stay importable from here, where callers have always found them.
__all__ = [
    "After",
    "ArraySpec",
    "ClusterFacts",
    "CodePaths",
    "LaunchPlan",
    "ReplicaSupervision",
    "TrainerStop",
    "format_argv",
    "make_plan",
    "replica_groups",
    "sbatch_directives",
    "script_path",
    "trainer_stop",
    "worker_command",
]


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
    """fault_tolerance.mode: replica_groups: what the script says of the groups (the
    supervisor, ``ddlaunch.job.groups``, reads its settings from the run's config)."""

    groups: int
    nodes_per_group: int
    min_groups: int


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
    # What is said about the plan rather than run (the script's comments, the warnings):
    # worked out where shown, once (planning.about); not part of the plan's value.
    about: About = field(default_factory=About, repr=False, compare=False)

    @property
    def script_path(self) -> str:
        return script_path(self.run_dir, self.array)

    @property
    def mode(self) -> str:
        """How each attempt starts the ranks: the script's launch part includes
        ``partials/mode_<mode>.sh.j2`` (one partial per mode, each overridable by a site).
        ``plain``: one srun step of every rank; ``elastic``: hot spares or ``nodes.min``, each
        attempt on the nodes the start hook places it on; ``in_process`` (and
        ``in_process_elastic``): a standby step beside the ranks; ``replica_groups``: the
        groups' supervisor starts one step per group."""
        if self.replica_groups is not None:
            return "replica_groups"
        if self.standby_srun_argv:
            return "in_process_elastic" if self.elastic else "in_process"
        return "elastic" if self.elastic else "plain"

    @property
    def notes(self) -> tuple[str, ...]:
        """Comment lines of the script: the parallelism placement and the data staging."""
        return self.about.notes

    @property
    def warnings(self) -> tuple[str, ...]:
        """Valid but slow choices, also printed by render/submit."""
        return self.about.warnings

    @property
    def rank_command(self) -> str:
        """What each rank runs, for the script's comment."""
        return self.about.rank_command


def script_path(run_dir: str, array: ArraySpec | None = None) -> str:
    if array is None:
        return str(PurePosixPath(run_dir) / SCRIPT_FILE)
    return str(PurePosixPath(run_dir) / ARRAYS_DIR / f"{array.name}.sbatch")


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
    ``after``: the runs it is submitted after (``submit --after``). ``cfg`` was validated,
    for the Slurm target too; ``facts`` were checked by the caller (a sweep splits its
    arrays at MaxArraySize)."""
    after = after or After()
    code = code or CodePaths()
    ranks_dir = code.workdir or cfg.launch.workdir or workdir
    run = PurePosixPath(run_dir)
    layout = rank_log_layout(cfg)
    parts = _components(cfg, run)
    env = fabric.fabric_env(cfg)
    fabric_env = tuple((k, v) for k, v in env.items() if k not in cfg.launch.env)
    tracking = tracking_env(cfg, run_id if array is None else array.sweep_id)
    in_container = cfg.container.runtime != "none"
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
    ft = cfg.fault_tolerance
    in_process = ft.restart == "in_process"
    return LaunchPlan(
        run_id=run_id,
        run_dir=str(run),
        directives=tuple(sbatch_directives(cfg, exclude, after.edges)),
        sbatch_argv=_sbatch_argv(cfg, run, array, ranks_dir),
        ddlaunch_env=_ddlaunch_env(cfg, run, array, after, parts),
        fabric_env=fabric_env,
        user_env=tuple(cfg.launch.env.items()),
        setup=cfg.launch.setup,
        srun_argv=(*_srun_argv(cfg, run, array, layout, parts), *launch.srun_args),
        worker_argv=(*launch.prefix, *worker_command(cfg, str(run / SUBMITIT_DIR))),
        ranks_per_node=cfg.ranks_per_node,
        world_size=cfg.world_size,
        signal=ft.signal,
        python=cfg.launch.python,
        array=array,
        code_dir=code.snapshot,
        pythonpath=pythonpath,
        container_runtime=cfg.container.runtime,
        elastic=cfg.elastic,
        check_spares=ft.spare_nodes > 0 and cfg.health.preflight,
        replica_groups=replica_groups(cfg),
        container_exports=launch.exports,
        mkdirs=tuple(mkdirs) if in_container else (),
        tracking_env=tracking,
        trainer_stop=trainer_stop(cfg),
        env_from_submit=tuple(cfg.launch.env_from_submit),
        rank_logs=layout,
        **standbys(cfg, run, launch.prefix, launch.srun_args, array),
        standbys_per_node=ft.standbys_per_node if in_process else 0,
        memory_checkpoint=in_process and ft.memory_checkpoint == "auto",
        memory_every_steps=ft.memory_every_steps,
        components=parts,
        about=About(cfg, None if array else str(run)),
    )


def _sbatch_argv(
    cfg: Config, run: PurePosixPath, array: ArraySpec | None, ranks_dir: str
) -> tuple[str, ...]:
    """The sbatch command line: the batch log (an array's, until the script switches to the
    member's), the variables passed by name, the ranks' directory and the script."""
    logs = run / LOGS_DIR
    submission: tuple[str, ...]
    if array is None:
        submission = (f"--output={logs / 'batch-%j.out'}",)
    else:
        # Only what the script prints before it switches to the member's own batch log.
        submission = (f"--array={array.spec}", f"--output={logs / 'batch-%A_%a.out'}")
    # sbatch takes each named variable's value from its own environment: the values never
    # reach the script, the run directory or the intent record (which keeps this argv).
    passed = cfg.launch.env_from_submit
    export = (f"--export={','.join(('ALL', *passed))}",) if passed else ()
    return (
        "sbatch",
        "--parsable",
        *submission,
        *export,
        f"--chdir={ranks_dir}",
        script_path(str(run), array),
    )


def _srun_argv(
    cfg: Config,
    run: PurePosixPath,
    array: ArraySpec | None,
    layout: str,
    parts: ComponentsPlan | None,
) -> tuple[str, ...]:
    """The ranks' srun step, before a container's options."""
    rank_logs: tuple[str, ...]
    if parts is not None:
        rank_logs = parts.train_srun_args
    elif array is None:
        # One run: rank logs go straight to its run directory.
        logs = run / LOGS_DIR
        name = "node-%N" if layout == NODE_LOGS else "rank-%t"
        rank_logs = (f"--output={logs / (name + '.out')}", f"--error={logs / (name + '.err')}")
    else:
        # The member is known only at run time: the script points srun at the member's
        # logs through SLURM_STDOUTMODE / SLURM_STDERRMODE, which srun reads when the
        # command line has no --output / --error.
        rank_logs = ()
    return (
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
        *rank_order_args(cfg),
    )


def _ddlaunch_env(
    cfg: Config,
    run: PurePosixPath,
    array: ArraySpec | None,
    after: After,
    parts: ComponentsPlan | None,
) -> tuple[tuple[str, str], ...]:
    """ddlaunch's own variables of the script, after the run's directory and id."""
    ours: dict[str, str] = {}
    if array is None:
        # (An array task exports its member's checkpoint directory itself.)
        ours["DDLAUNCH_CHECKPOINT_DIR"] = cfg.storage.checkpoint_dir or str(run / CHECKPOINTS_DIR)
    if cfg.storage.scratch:
        ours["DDLAUNCH_SCRATCH"] = cfg.storage.scratch
    ours.update(after.env)
    if parts is not None:
        ours[parts.train_ranks_var] = parts.train_ranks
    if cfg.container.runtime != "none":
        ours[CONCLUDE_ON_HOST_VAR] = "1"
    return tuple(ours.items())


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
    )
