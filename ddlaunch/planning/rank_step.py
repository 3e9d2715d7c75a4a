"""What the ranks' srun step runs (pure): each task's command (``worker_command``), the rank
order srun is told, the standby step of ``fault_tolerance.restart: in_process``, and what each
rank runs as the script's comment says it (``rank_command``)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from ddlaunch.config.schema import Config
from ddlaunch.config.trainers import is_byo, placeholders, substitute
from ddlaunch.planning.inputs import ArraySpec
from ddlaunch.store.layout import CHECKPOINTS_DIR, LOGS_DIR, SUBMITIT_DIR


def format_argv(argv: Sequence[str]) -> str:
    return shlex.join(argv)


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


def standbys(
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


def rank_order_args(cfg: Config) -> list[str]:
    """A parallelism plan places ranks node by node (``planning.parallel.rank_of``): say so
    to srun, whose default a SLURM_DISTRIBUTION in the submitting shell could change.
    CPU binding passes --distribution=block:block already."""
    if cfg.parallel.configured and not cfg.cluster.cpu_binding:
        return ["--distribution=block"]
    return []
