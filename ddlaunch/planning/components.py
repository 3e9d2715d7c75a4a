"""A heterogeneous job's part of the plan (``components:``; pure).

Slurm numbers a heterogeneous job's components 0..n-1 in the order of their ``#SBATCH
hetjob`` blocks: that is the order of ``components:``. The train components' ranks are one
srun step over their groups (``--het-group=0,1``): Slurm numbers its tasks group by group,
which makes the ranks component by component. Each service is a step of its own group, kept
running by ``ddlaunch.job.components``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddlaunch.config.components import (
    SERVICE,
    TRAIN,
    TRAIN_COMPONENTS_VAR,
    ComponentSpec,
    env_prefix,
    gpus_of,
    ranks_per_node,
)
from ddlaunch.config.schema import Config
from ddlaunch.store.layout import LOGS_DIR

# Directives that describe one component's nodes; every other one is the job's, said once in
# the first block (a later block's --job-name or --signal would be ignored or refused).
_PER_COMPONENT = (
    "--partition",
    "--account",
    "--qos",
    "--reservation",
    "--nodes",
    "--ntasks-per-node",
    "--gpus-per-node",
    "--cpus-per-task",
    "--mem",
    "--mem-per-cpu",
    "--mem-per-gpu",
    "--constraint",
    "--exclusive",
    "--exclude",
)


@dataclass(frozen=True)
class Service:
    """A ``role: service`` component: its heterogeneous group, the srun step that runs its
    command (output in ``logs/<name>-<node>-<task>.out|.err``) and its own variables."""

    name: str
    group: int
    srun_argv: tuple[str, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ComponentsPlan:
    """``names``: every component's name by group, with the prefix of its variables;
    ``train_groups``: the ``--het-group`` value of the ranks' step; ``train_ranks``: the
    value of ``DDLAUNCH_TRAIN_COMPONENTS``; ``max_restarts``: how often a failed service is
    started again."""

    names: tuple[tuple[str, str], ...]
    train_groups: str
    train_ranks: str
    services: tuple[Service, ...]
    max_restarts: int
    train_srun_args: tuple[str, ...]  # the ranks' srun options (``train_srun_args``)
    train_nodes_expr: str  # a shell word: the train components' nodes, comma-separated
    train_ranks_var: str = TRAIN_COMPONENTS_VAR


def plan_components(cfg: Config, run: PurePosixPath) -> ComponentsPlan | None:
    if not cfg.components:
        return None
    default = _default_gpus(cfg)
    train = [(i, c) for i, c in enumerate(cfg.components) if c.role == TRAIN]
    groups = ",".join(str(i) for i, _ in train)
    prefixes = [env_prefix(c.name) for _, c in train]
    return ComponentsPlan(
        names=tuple((c.name, env_prefix(c.name)) for c in cfg.components),
        train_groups=groups,
        train_ranks=",".join(
            f"{c.name}:{c.nodes.count * ranks_per_node(c, default)}" for _, c in train
        ),
        services=tuple(
            _service(i, c, run) for i, c in enumerate(cfg.components) if c.role == SERVICE
        ),
        max_restarts=cfg.fault_tolerance.max_restarts,
        train_srun_args=train_srun_args(run / LOGS_DIR, groups),
        train_nodes_expr='"' + ",".join(f"${{{prefix}_NODES}}" for prefix in prefixes) + '"',
    )


def het_directives(
    cfg: Config, job_wide: Sequence[tuple[str, str | None]]
) -> list[tuple[str, str | None]]:
    """The ``#SBATCH`` lines of a heterogeneous job: the job's own lines (``job_wide``, as
    ``plan.sbatch_directives`` makes them for one component) with the node lines replaced by
    the first component's, then a ``hetjob`` block per further component."""
    values = dict(job_wide)
    shared = [(flag, value) for flag, value in job_wide if flag not in _PER_COMPONENT]
    default = _default_gpus(cfg)
    blocks = [_component_lines(cfg, c, values, default) for c in cfg.components]
    out = [*shared[:1], *blocks[0], *shared[1:]]
    for block in blocks[1:]:
        out += [("hetjob", None), *block]
    return out


def _component_lines(
    cfg: Config, comp: ComponentSpec, job: dict[str, str | None], default_gpus: int
) -> list[tuple[str, str | None]]:
    nodes = comp.nodes
    # A service takes GPUs only when it asks: it does not inherit the ranks' count.
    gpus = gpus_of(comp, default_gpus) if comp.role == TRAIN else nodes.gpus_per_node or 0
    tasks = ranks_per_node(comp, default_gpus) if comp.role == TRAIN else nodes.tasks_per_node or 1
    lines: list[tuple[str, str | None]] = []
    for flag in ("--partition", "--account", "--qos", "--reservation"):
        value = nodes.partition if flag == "--partition" and nodes.partition else job.get(flag)
        if value:
            lines.append((flag, value))
    lines += [("--nodes", str(nodes.count)), ("--ntasks-per-node", str(tasks))]
    if gpus:
        lines.append(
            ("--gpus-per-node", f"{nodes.gpu_type}:{gpus}" if nodes.gpu_type else str(gpus))
        )
    if job.get("--cpus-per-task"):
        # A service takes Slurm's default of 1, but says so: Slurm 26.05's srun across the
        # components (the doctor's) refuses a job where some set it and others do not
        # ("cpus-per-task set by two different environment variables").
        lines.append(("--cpus-per-task", job["--cpus-per-task"] if comp.role == TRAIN else "1"))
    mem = nodes.mem or job.get("--mem")
    if mem:
        lines.append(("--mem", mem))
    for flag in ("--mem-per-cpu", "--mem-per-gpu"):
        if job.get(flag) and (flag != "--mem-per-gpu" or gpus):
            lines.append((flag, job[flag]))
    constraint = nodes.constraint or job.get("--constraint")
    if constraint:
        lines.append(("--constraint", constraint))
    lines += [(flag, job[flag]) for flag in ("--exclusive", "--exclude") if flag in job]
    return lines


def _service(group: int, comp: ComponentSpec, run: PurePosixPath) -> Service:
    logs = run / LOGS_DIR
    srun = (
        "srun",
        f"--het-group={group}",
        # A service's task that fails ends its step: the supervisor starts it again whole.
        "--kill-on-bad-exit=1",
        f"--output={logs / f'{comp.name}-%N-%t.out'}",
        f"--error={logs / f'{comp.name}-%N-%t.err'}",
    )
    return Service(
        name=comp.name,
        group=group,
        srun_argv=srun,
        command=comp.launch.command,
        env=tuple(comp.launch.env.items()),
    )


def _default_gpus(cfg: Config) -> int:
    """The GPUs per node of a train component that does not say: validation wrote the
    train components' common count into nodes.gpus_per_node."""
    return cfg.nodes.gpus_per_node


def train_srun_args(logs: PurePosixPath, groups: str) -> tuple[str, ...]:
    """What the ranks' srun gets in a heterogeneous job instead of the rank log files:
    Slurm's ``%t`` is not the rank across groups, so each rank appends to
    ``logs/rank-<R>`` itself (``worker.task``); srun's own files, one per node with each line
    labelled (``--label``, in the plan), keep what a rank prints before that."""
    return (
        f"--het-group={groups}",
        f"--output={logs / 'node-%N.out'}",
        f"--error={logs / 'node-%N.err'}",
    )
