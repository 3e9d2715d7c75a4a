"""What ``render`` and ``submit --dry-run`` say about the plan (pure text): the placement of the
parallelism plan with its estimated communication per step, and the data staging. The lines
become comments of the batch script, so the run directory's ``job.sbatch`` keeps them.

With ``fault_tolerance.mode: replica_groups`` the placement is the groups' (their nodes, one
group's plan, dp_replicate's peers across the groups), in job-wide ranks; job mode's lines
are left as they were (the golden renders hold them)."""

from __future__ import annotations

from collections.abc import Iterable

from ddlaunch.config.schema import Config
from ddlaunch.planning import commcost, staging
from ddlaunch.planning.parallel import (
    ParallelPlan,
    ReplicaGroups,
    Span,
    parallel_plan,
    ranks_text,
    replica_groups,
)
from ddlaunch.wording import counted

SHOWN_NODES = 4  # per-node lines before "... more nodes"
SHOWN_GROUPS = 2


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def _gbps(value: float) -> str:
    return f"{value:.4g} Gbit/s"


def described(cfg: Config) -> tuple[list[str], list[str]]:
    """(the script's comment lines, the warnings), the parallelism plan placed once: what
    ``planning.about`` asks for the first time a plan's notes or warnings are shown."""
    plan = parallel_plan(cfg) if cfg.parallel.configured else None
    found = warnings(cfg, plan)
    return [*parallel_lines(cfg, plan, found), *staging_lines(cfg)], found


def warnings(cfg: Config, plan: ParallelPlan | None = None) -> list[str]:
    """Plans that are valid but slow (tp or cp across PCIe), or that leave a check out
    (``plan``: ``cfg``'s parallelism plan, when the caller placed it already)."""
    out = []
    if cfg.fault_tolerance.mode == "replica_groups" and cfg.health.preflight:
        out.append(
            "health.preflight is not run with fault_tolerance.mode: replica_groups (not built "
            "yet for groups started apart); the groups' supervisor probes their nodes instead"
        )
    return out + _pcie_warnings(cfg, plan)


def _pcie_warnings(cfg: Config, plan: ParallelPlan | None) -> list[str]:
    if not cfg.parallel.configured or cfg.topology.interconnect != "pcie":
        return []
    plan = plan or parallel_plan(cfg)
    bw = commcost.intra_node(cfg)
    nominal = cfg.parallel.intra_node_gbps is None
    source = commcost.INTRA["pcie"][1] if nominal else bw.source
    nvswitch = commcost.INTRA["nvswitch"][0]
    out = []
    for dim in ("tp", "cp"):
        if plan.size(dim) > 1:
            out.append(
                f"parallel.{dim}: {plan.size(dim)} on PCIe nodes (topology.interconnect pcie): "
                f"its collectives see {_gbps(bw.gbps)} per GPU ({source}), "
                f"{nvswitch / bw.gbps:.0f}x less than NVSwitch"
            )
    return out


def _dims_lines(plan: ParallelPlan) -> list[str]:
    rows = [_DIMS_HEADER]
    for dim in reversed(plan.names):
        span = plan.span(dim)
        if span.size == 1:
            continue
        rows.append(_dim_row(span, span.groups, _where(span), plan.groups(dim)))
    if len(rows) == 1:
        rows.append("(one rank: no groups)")
    return rows


_DIMS_HEADER = f"{'dim':<13} {'size':>4} {'groups':>6}  {'where':<34} first groups"


def _where(span: Span) -> str:
    if span.inside_node:
        return "inside a node"
    return f"across {counted(span.nodes, 'node')}, {counted(span.per_node, 'rank')} on each"


def _dim_row(span: Span, groups: int, where: str, found: Iterable[list[int]]) -> str:
    """One dimension: its size, how many groups the job has, where a group lies and the
    first groups' ranks."""
    shown = []
    for i, group in enumerate(found):
        if i == SHOWN_GROUPS:
            shown.append("...")
            break
        shown.append(ranks_text(group))
    return f"{span.dim:<13} {span.size:>4} {groups:>6}  {where:<34} {' '.join(shown)}"


def _node_lines(plan: ParallelPlan, replicas: ReplicaGroups | None = None) -> list[str]:
    g = plan.ranks_per_node
    inner = [d for d in ("tp", "cp") if plan.size(d) > 1 and plan.span(d).inside_node]
    lines = []
    for node in range(min(plan.nodes, SHOWN_NODES)):
        first = node * g
        ranks = f"ranks {first}-{first + g - 1}" if g > 1 else f"rank {first}"
        group = f" (group {replicas.group_of_node(node)})" if replicas else ""
        text = f"node {node}{group}: {ranks}"
        for dim in inner:
            groups = {tuple(plan.group(dim, r)) for r in range(first, first + g)}
            text += f"; {dim} " + " ".join(ranks_text(list(grp)) for grp in sorted(groups))
        lines.append(text)
    if plan.nodes > SHOWN_NODES:
        lines.append(f"... {plan.nodes - SHOWN_NODES} more nodes, the same pattern")
    return lines


def _cost_lines(plan: ParallelPlan, cfg: Config) -> list[str]:
    costs = commcost.estimate(plan, cfg)
    if not costs:
        return []
    lines = [
        "Communication per step (estimate: ring collectives at nominal bandwidth, no overlap):"
    ]
    total = 0.0
    for c in costs:
        if c.bytes_per_rank is None:
            lines.append(f"  {c.dim:<13} {c.what}")
            continue
        seconds = c.seconds or 0.0
        total += seconds
        lines.append(
            f"  {c.dim:<13} {_size(c.bytes_per_rank):>9} a rank ({c.what}) "
            f"{c.link} at {_gbps(c.bandwidth_gbps or 0)} a rank: {_time(seconds)}"
        )
    if total:
        lines.append(f"  {'total':<13} {_time(total)} a step if nothing overlaps")
    inside, across = commcost.intra_node(cfg), commcost.inter_node(cfg)
    lines.append(f"  inside a node: {_gbps(inside.gbps)} per GPU, {inside.source}")
    lines.append(
        f"  across nodes: {_gbps(across.gbps)} per node, shared by its "
        f"{counted(plan.ranks_per_node, 'rank')}, {across.source}"
    )
    return lines


def parallel_lines(
    cfg: Config, plan: ParallelPlan | None = None, found: list[str] | None = None
) -> list[str]:
    """The placement and the estimate; nothing unless ``parallel:`` sets a degree
    (``plan``, ``found``: ``cfg``'s parallelism plan and warnings, when worked out already)."""
    if not cfg.parallel.configured:
        return []
    plan = plan or parallel_plan(cfg)
    d = plan.degrees
    unit = "GPU" if cfg.nodes.gpus_per_node else "rank"
    shape = ", ".join(f"{n} {s}" for n, s in zip(plan.names, plan.shape, strict=True))
    head = (
        f"Parallelism (parallel:): {counted(plan.world, 'rank')} on "
        f"{counted(plan.nodes, 'node')} x {counted(plan.ranks_per_node, unit)} = dp {d.dp} "
        f"(replicate {d.dp_replicate} x shard {d.dp_shard}) x tp {d.tp} x pp {d.pp} x cp {d.cp}"
    )
    order = (
        f"rank r runs on node r // {plan.ranks_per_node} (allocation order, srun "
        "--distribution=block)"
    )
    replicas = replica_groups(cfg)
    if replicas is not None:
        placement = [*_group_lines(replicas), order, *_group_dims_lines(replicas)]
    else:
        placement = [f"device_mesh() dims, outermost first: {shape}", order, *_dims_lines(plan)]
    lines = [head, *placement, *_node_lines(plan, replicas), *_cost_lines(plan, cfg)]
    found = warnings(cfg, plan) if found is None else found
    return lines + [f"warning: {w}" for w in found]


def _node_range(nodes: range) -> str:
    return f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"


def _group_lines(replicas: ReplicaGroups) -> list[str]:
    """What replica groups make of the job: its fault domains, each group's own world and
    how its ranks are named job-wide."""
    count, k = replicas.count, replicas.nodes_per_group
    listed = [_node_range(replicas.nodes(g)) for g in range(count)]
    if count > 2 * SHOWN_GROUPS:
        listed = [*listed[:SHOWN_GROUPS], "...", listed[-1]]
    size = counted(k, "node")
    inner = replicas.inner
    shape = ", ".join(
        f"{n} {s}" for n, s in zip(inner.names, inner.shape, strict=True) if n != "dp_replicate"
    )
    ranks = replicas.ranks_per_group
    return [
        f"replica groups: {count} x {size} ({' | '.join(listed)}), torchft; a failure restarts "
        f"its group only; min {replicas.min_live} live",
        f"each group is its own world of {counted(ranks, 'rank')}, its mesh outermost first: "
        f"{shape}; "
        f"dp_replicate {count} across the groups, through torchft",
        f"group g's rank r is the job's rank g x {ranks} + r",
    ]


def _group_dims_lines(replicas: ReplicaGroups) -> list[str]:
    """The dimensions of one group's plan (group 0's ranks, job-wide groups counted), then
    dp_replicate across the groups."""
    inner, count = replicas.inner, replicas.count
    rows = [_DIMS_HEADER]
    for dim in reversed(inner.names):
        span = inner.span(dim)
        if span.size == 1:
            continue
        rows.append(_dim_row(span, span.groups * count, _where(span), inner.groups(dim)))
    across = replicas.span()
    peers = (replicas.peers(r) for r in range(replicas.ranks_per_group))
    rows.append(
        _dim_row(across, across.groups, f"across {counted(count, 'group')}, torchft", peers)
    )
    return rows


def staging_lines(cfg: Config) -> list[str]:
    found = staging.targets(cfg)
    if not found:
        return []
    lines = ["Data staging (storage.stage), once per node before the first step:"]
    for t in found:
        lines.append(f"  {t.name} ({t.mode}): {t.src} -> {t.dst}, ${t.env}")
    return lines
