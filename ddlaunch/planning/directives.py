"""The ``#SBATCH`` lines of a job, in a stable order (pure): the job's shape and limits, the
placement, the pre-timeout signal, requeue and the ``sbatch:`` escape hatch; a
heterogeneous job's blocks come from ``planning.components``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ddlaunch.config.schema import Config
from ddlaunch.config.trainers import is_byo
from ddlaunch.planning import topology

# Only as a type: ``policy.chain`` is imported only when there are ``--after`` edges.
if TYPE_CHECKING:
    from ddlaunch.policy.chain import Edge


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
    # Slurm requeues a requeueable job by itself when a node fails or it is preempted, before
    # any hook of ours can decide: a run whose policy allows no requeue must not be one.
    requeueable = job.requeue and ft.max_requeues > 0
    out.append(("--requeue", None) if requeueable else ("--no-requeue", None))
    # Keep earlier attempts' output when Slurm requeues the job.
    out.append(("--open-mode", "append"))
    for option, value in cfg.sbatch.items():
        if value is False or value is None:
            continue
        out.append((f"--{option}", None if value is True else str(value)))
    return out


def _dependency(edges: Sequence[Edge], configured: str | None) -> str | None:
    """``policy.chain.dependency``, imported only when there are ``--after`` edges: without
    them the value is ``job.dependency`` as configured."""
    if not edges:
        return configured or None
    from ddlaunch.policy.chain import dependency

    return dependency(edges, configured)
