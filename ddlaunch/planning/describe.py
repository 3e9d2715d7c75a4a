"""What ``render`` and ``submit --dry-run`` say about the plan (pure text): the placement of the
parallelism plan with its estimated communication per step, and the data staging. The lines
become comments of the batch script, so the run directory's ``job.sbatch`` keeps them."""

from __future__ import annotations

from ddlaunch.config.schema import Config
from ddlaunch.planning import commcost, staging
from ddlaunch.planning.parallel import ParallelPlan, parallel_plan, ranks_text

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


def warnings(cfg: Config) -> list[str]:
    """Plans that are valid but slow: tp or cp across PCIe."""
    if not cfg.parallel.configured or cfg.topology.interconnect != "pcie":
        return []
    plan = parallel_plan(cfg)
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
    rows = [f"{'dim':<13} {'size':>4} {'groups':>6}  {'where':<34} first groups"]
    for dim in reversed(plan.names):
        span = plan.span(dim)
        if span.size == 1:
            continue
        if span.inside_node:
            where = "inside a node"
        else:
            ranks = "1 rank" if span.per_node == 1 else f"{span.per_node} ranks"
            where = f"across {span.nodes} nodes, {ranks} on each"
        shown = []
        for i, group in enumerate(plan.groups(dim)):
            if i == SHOWN_GROUPS:
                shown.append("...")
                break
            shown.append(ranks_text(group))
        rows.append(f"{dim:<13} {span.size:>4} {span.groups:>6}  {where:<34} {' '.join(shown)}")
    if len(rows) == 1:
        rows.append("(one rank: no groups)")
    return rows


def _node_lines(plan: ParallelPlan) -> list[str]:
    g = plan.ranks_per_node
    inner = [d for d in ("tp", "cp") if plan.size(d) > 1 and plan.span(d).inside_node]
    lines = []
    for node in range(min(plan.nodes, SHOWN_NODES)):
        first = node * g
        ranks = f"ranks {first}-{first + g - 1}" if g > 1 else f"rank {first}"
        text = f"node {node}: {ranks}"
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
        f"{plan.ranks_per_node} ranks, {across.source}"
    )
    return lines


def parallel_lines(cfg: Config) -> list[str]:
    """The placement and the estimate; nothing unless ``parallel:`` sets a degree."""
    if not cfg.parallel.configured:
        return []
    plan = parallel_plan(cfg)
    d = plan.degrees
    unit = "GPUs" if cfg.nodes.gpus_per_node else "ranks"
    shape = ", ".join(f"{n} {s}" for n, s in zip(plan.names, plan.shape, strict=True))
    lines = [
        f"Parallelism (parallel:): {plan.world} ranks on {plan.nodes} nodes x "
        f"{plan.ranks_per_node} {unit} = dp {d.dp} (replicate {d.dp_replicate} x shard "
        f"{d.dp_shard}) x tp {d.tp} x pp {d.pp} x cp {d.cp}",
        f"device_mesh() dims, outermost first: {shape}",
        f"rank r runs on node r // {plan.ranks_per_node} (allocation order, srun "
        "--distribution=block)",
        *_dims_lines(plan),
        *_node_lines(plan),
        *_cost_lines(plan, cfg),
    ]
    return lines + [f"warning: {w}" for w in warnings(cfg)]


def staging_lines(cfg: Config) -> list[str]:
    found = staging.targets(cfg)
    if not found:
        return []
    lines = ["Data staging (storage.stage), once per node before the first step:"]
    for t in found:
        lines.append(f"  {t.name} ({t.mode}): {t.src} -> {t.dst}, ${t.env}")
    return lines
