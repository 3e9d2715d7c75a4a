"""Whether a job can ever start in its partition, from facts probed at the edge (pure).

``ddlaunch submit`` (and ``resume``, ``sweep``, ``doctor``) ask this before sbatch: a job
that asks for more nodes or GPUs than its partition has, or more than its MaxNodes or
MaxTime, would pend forever (``PartitionNodeLimit``, ``PartitionTimeLimit``) or be refused by
sbatch with a message that names none of the numbers. So would one whose excluded nodes
(the config's, plus the bad-node list's) leave too few: the answer names each excluded node
and why it is excluded. The facts come from one ``sinfo`` call (``slurm.partitions``).

The same rule holds at a requeue that excludes nodes (``requeue_shortage``): a job requeued
without a failed node that leaves its partition too few usable ones would stay PENDING
(BadConstraints) for good, so the run stops there instead, saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ddlaunch.config.schema import Config
from ddlaunch.config.validate import parse_duration
from ddlaunch.planning import topology
from ddlaunch.slurm.partitions import PartitionFacts
from ddlaunch.wording import counted, plural


def find_partition(partitions: Sequence[PartitionFacts], name: str | None) -> PartitionFacts | None:
    """The named partition, else the cluster's default one (None: no such partition)."""
    for part in partitions:
        if (name is None and part.default) or part.name == name:
            return part
    return None


def unknown_nodes(partitions: Sequence[PartitionFacts], names: Sequence[str]) -> list[str]:
    """Those of ``names`` that are no node of the cluster (of no partition)."""
    known = {node for part in partitions for node in part.nodes}
    return sorted(set(names) - known)


def _duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _asked(cfg: Config) -> tuple[int, str]:
    """The nodes the job allocates, and the key(s) that say so (hot spares count)."""
    spares = cfg.fault_tolerance.spare_nodes
    if spares:
        return (
            cfg.allocated_nodes,
            f"nodes.count + fault_tolerance.spare_nodes: {cfg.nodes.count} + {spares} =",
        )
    return cfg.nodes.count, "nodes.count:"


def _limits(cfg: Config, part: PartitionFacts) -> list[str]:
    problems = []
    where = f"partition {part.name}"
    wanted, keys = _asked(cfg)
    if part.max_nodes is not None and wanted > part.max_nodes:
        problems.append(
            f"{keys} {counted(wanted, 'node')} is more than {where}'s MaxNodes={part.max_nodes}"
        )
    limit = parse_duration(cfg.job.time)
    if part.max_time_s is not None and (limit == 0 or (limit or 0) > part.max_time_s):
        most = _duration(part.max_time_s)
        problems.append(f"job.time: {cfg.job.time} is longer than {where}'s MaxTime={most}")
    gpus, most_gpus = cfg.nodes.gpus_per_node, max(part.gpus, default=0)
    if gpus > most_gpus:
        problems.append(
            f"nodes.gpus_per_node: {counted(gpus, 'GPU')} per node, but the nodes of {where} "
            f"have at most {most_gpus}"
        )
    cpus, most_cpus = _cpus_per_node(cfg), max(part.cpus, default=0)
    if cpus and most_cpus and cpus > most_cpus:
        problems.append(
            f"nodes.cpus_per_task: {counted(cpus, 'CPU')} per node "
            f"({counted(cfg.ranks_per_node, 'rank')}), but the "
            f"nodes of {where} have at most {most_cpus}"
        )
    return problems


def _cpus_per_node(cfg: Config) -> int:
    per_task = topology.cpus_per_task(cfg) or 1
    return per_task * cfg.ranks_per_node


def _fits(cfg: Config, part: PartitionFacts, node: str) -> bool:
    index = part.nodes.index(node)
    cpus = part.cpus[index]
    return part.gpus[index] >= cfg.nodes.gpus_per_node and (not cpus or cpus >= _cpus_per_node(cfg))


def _kind(cfg: Config) -> str:
    gpus = cfg.nodes.gpus_per_node
    return f" with {counted(gpus, 'GPU')} or more" if gpus else ""


def _enough_nodes(cfg: Config, part: PartitionFacts, excluded: Mapping[str, str]) -> list[str]:
    where = f"partition {part.name}"
    fitting = [n for n in part.nodes if _fits(cfg, part, n)]
    has = f"{where} has {counted(len(fitting), 'node')}{_kind(cfg)}"
    wanted, keys = _asked(cfg)
    if len(fitting) < wanted:
        return [f"{keys} {counted(wanted, 'node')}, but {has}"]
    out = sorted(n for n in fitting if n in excluded)
    if len(fitting) - len(out) >= wanted:
        return []
    lines = [
        f"{keys} {counted(wanted, 'node')}, but {has} and {len(out)} of them "
        f"{plural(len(out), 'is', 'are')} excluded, "
        f"which leaves {len(fitting) - len(out)}:"
    ]
    return lines + [f"  {node}: {excluded[node]}" for node in out]


def problems(
    cfg: Config,
    partitions: Sequence[PartitionFacts],
    excluded: Mapping[str, str],
    env_partition: str | None = None,
) -> list[str]:
    """Why the job can never start (empty: it can, as far as the facts tell). ``excluded``:
    node -> why it is kept out (the config's ``nodes.exclude``, the bad-node list).
    ``env_partition``: the submitting shell's ``SBATCH_PARTITION``, which sbatch uses when
    ``job.partition`` is unset, so the job is checked against the partition it will run in."""
    if not partitions:
        return []  # not probed: nothing to say
    if cfg.components:
        return _component_problems(cfg, partitions, excluded, env_partition)
    wanted, key = cfg.job.partition, "job.partition"
    if wanted is None and env_partition:
        wanted, key = env_partition, "SBATCH_PARTITION (job.partition unset)"
    part = find_partition(partitions, wanted)
    if part is None:
        if wanted is None:
            return []  # no default partition: sbatch will say what it wants
        names = ", ".join(p.name for p in partitions)
        return [f"{key}: no partition {wanted!r} (the cluster has {names})"]
    out = _limits(cfg, part)
    strangers = [n for n in cfg.nodes.nodelist if n not in part.nodes]
    if strangers:
        out.append(f"nodes.nodelist: {', '.join(strangers)} not in partition {part.name}")
    unknown = unknown_nodes(partitions, cfg.nodes.exclude)
    if unknown:
        out.append(f"nodes.exclude: {', '.join(unknown)}: no such node in the cluster")
    if not out:
        out += _enough_nodes(cfg, part, excluded)
    return out


def _component_problems(
    cfg: Config,
    partitions: Sequence[PartitionFacts],
    excluded: Mapping[str, str],
    env_partition: str | None,
) -> list[str]:
    """A heterogeneous job starts only when every component can: each is checked as a job
    of its own nodes in its own partition (its lines prefixed with the component), and the
    components that share a partition must fit in it together (no node serves two)."""
    from ddlaunch.config.components import TRAIN, ranks_per_node

    out: list[str] = []
    default_gpus = cfg.nodes.gpus_per_node
    shared: dict[str, list[tuple[str, int]]] = {}
    for i, comp in enumerate(cfg.components):
        train = comp.role == TRAIN
        gpus = ranks_per_node(comp, default_gpus) if train else comp.nodes.gpus_per_node or 0
        nodes = replace(
            cfg.nodes,
            count=comp.nodes.count,
            gpus_per_node=gpus if train else 0,
            tasks_per_node=None if gpus and train else comp.nodes.tasks_per_node or 1,
        )
        job = replace(cfg.job, partition=comp.nodes.partition or cfg.job.partition)
        alone = replace(cfg, nodes=nodes, job=job, components=())
        if not train:  # a service asks for its GPUs as a count, not one rank per GPU
            alone = replace(alone, nodes=replace(alone.nodes, gpus_per_node=gpus))
        out += [
            f"components.{i} ({comp.name}): {line}"
            for line in problems(alone, partitions, excluded, env_partition)
        ]
        name = job.partition or env_partition or ""
        shared.setdefault(name, []).append((comp.name, comp.nodes.count))
    for name, members in shared.items():
        part = find_partition(partitions, name or None)
        total = sum(count for _, count in members)
        if part is None or len(members) < 2 or total <= len(part.nodes):
            continue
        listed = " + ".join(f"{count} ({comp})" for comp, count in members)
        out.append(
            f"components: {listed} = {total} nodes in partition {part.name}, which has "
            f"{len(part.nodes)}"
        )
    return out


def requeue_shortage(
    cfg: Config,
    partitions: Sequence[PartitionFacts],
    excluded: Mapping[str, str],
    leaving: Sequence[str],
    running_in: str | None = None,
) -> str | None:
    """Why the job, requeued with ``excluded`` kept out (node -> why), could never start
    again: one line naming the nodes this requeue newly leaves out (``leaving``) and the
    counts, for the run's final decision. None when it can start, or when the facts cannot
    tell: none probed, or by them the job could not have started before this requeue
    either (yet it ran: they are not trusted to stop it now). ``problems``' rule decides.

    ``running_in``: the partition Slurm runs the job in (``SLURM_JOB_PARTITION``), which
    wins over ``job.partition``: ``SBATCH_PARTITION`` in sbatch's environment overrides the
    script's ``--partition``, and a job offered several partitions runs in one of them. A
    heterogeneous job's components keep their own."""
    if running_in and not cfg.components:
        cfg = replace(cfg, job=replace(cfg.job, partition=running_in))
    before = {n: why for n, why in excluded.items() if n not in leaving}
    if problems(cfg, partitions, before, running_in):
        return None
    found = problems(cfg, partitions, excluded, running_in)
    if not found:
        return None
    without = ", ".join(sorted(set(leaving))) or "the excluded nodes"
    part = None
    if not cfg.components:
        part = find_partition(partitions, cfg.job.partition or running_in)
    if part is None:  # a heterogeneous job: the first component that no longer fits says
        return f"stopped: the requeue without {without} could never start: {found[0]}"
    fitting = [n for n in part.nodes if _fits(cfg, part, n)]
    out = sum(1 for n in fitting if n in excluded)
    wanted = cfg.allocated_nodes
    spares = cfg.fault_tolerance.spare_nodes
    asked = (
        f"nodes.count {cfg.nodes.count} + fault_tolerance.spare_nodes {spares}"
        if spares
        else "nodes.count"
    )
    return (
        f"stopped: the requeue without {without} needs {counted(wanted, 'node')} ({asked}); "
        f"partition {part.name} has {len(fitting) - out} usable "
        f"({counted(len(fitting), 'node')}{_kind(cfg)}, "
        f"{out} excluded), so it could never start"
    )
