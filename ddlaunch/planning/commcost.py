"""Estimated communication per training step, per mesh dimension (pure).

An estimate, said as one: ring collectives at the links' nominal bandwidth, no overlap with
compute, no latency term. What each dimension moves per rank and step (P parameters, b bytes
a value, n the group's size; t = tokens_per_step / (dp x cp) tokens through each rank, h the
width, L the layers; ring all-reduce moves 2(n-1)/n of the data per rank, all-gather and
reduce-scatter (n-1)/n):

* dp_shard (FSDP): all-gather the parameters for forward and again for backward, and
  reduce-scatter the gradients: 3 (n-1)/n x P b / (tp pp);
* dp_replicate (HSDP replicas): all-reduce the gradient shards: 2 (n-1)/n x P b / (tp pp dp_shard);
  with ``fault_tolerance.mode: replica_groups`` the same all-reduce runs across the groups,
  through torchft, every step, and the other dimensions are placed inside one group;
* tp (Megatron-style, no sequence parallelism): two activation all-reduces per layer forward
  and two backward: 4 x 2 (n-1)/n x t h b x L / pp;
* cp (ring attention, as many K/V heads as heads): K and V pass around the ring forward,
  K, V and their gradients backward: 6 (n-1) x t (h / tp) b x L / pp;
* pp: activations to the next stage and gradients back, split across tp: 2 t h b / tp.

Bandwidth per rank: inside a node the interconnect's per-GPU figure; across nodes the
node's network figure shared by the node's ranks, which all communicate at once. Each figure
says where it comes from: the config's override, or the nominal rate in ``INTRA`` / ``INTER``
with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.config.schema import Config
from ddlaunch.planning.parallel import ParallelPlan, Span, replica_groups
from ddlaunch.wording import counted

# Per GPU and direction, Gbit/s (the datasheets give GB/s over both directions).
INTRA: dict[str, tuple[float, str]] = {
    "nvswitch": (3600.0, "NVLink 4 over NVSwitch, 900 GB/s per GPU both ways (H100 SXM datasheet)"),
    "nvlink": (2400.0, "NVLink 3, 600 GB/s per GPU both ways (A100 SXM datasheet)"),
    "pcie": (256.0, "PCIe 4.0 x16, 32 GB/s per direction (PCI-SIG)"),
}
# Per node and direction, Gbit/s; ib and roce per adapter listed in fabric.hcas.
INTER: dict[str, tuple[float, str]] = {
    "ib": (400.0, "NDR InfiniBand, 400 Gbit/s per adapter (ConnectX-7 datasheet)"),
    "roce": (200.0, "200 GbE RoCE, 200 Gbit/s per adapter (ConnectX-6 Dx datasheet)"),
    "efa": (3200.0, "EFA, 3200 Gbit/s per p5.48xlarge node (AWS EC2 P5 instance page)"),
    "slingshot": (800.0, "Slingshot 11, 4 NICs x 200 Gbit/s per node (NERSC Perlmutter docs)"),
    "ethernet": (10.0, "assumed: plain Ethernet has no standard rate"),
}


@dataclass(frozen=True)
class Bandwidth:
    gbps: float
    source: str


@dataclass(frozen=True)
class DimCost:
    dim: str
    span: Span
    what: str  # the traffic, or what is missing to estimate it
    bytes_per_rank: float | None = None
    bandwidth_gbps: float | None = None  # per rank, on the link this dimension uses
    link: str = ""

    @property
    def seconds(self) -> float | None:
        if self.bytes_per_rank is None or not self.bandwidth_gbps:
            return None
        return self.bytes_per_rank * 8 / (self.bandwidth_gbps * 1e9)


def intra_node(cfg: Config) -> Bandwidth:
    if cfg.parallel.intra_node_gbps is not None:
        return Bandwidth(cfg.parallel.intra_node_gbps, "parallel.intra_node_gbps")
    kind = cfg.topology.interconnect
    gbps, source = INTRA[kind]
    return Bandwidth(gbps, f"nominal for topology.interconnect {kind}: {source}")


def inter_node(cfg: Config) -> Bandwidth:
    if cfg.parallel.inter_node_gbps is not None:
        return Bandwidth(cfg.parallel.inter_node_gbps, "parallel.inter_node_gbps")
    kind = cfg.fabric.kind
    gbps, source = INTER[kind]
    text = f"nominal for fabric.kind {kind}: {source}"
    if kind in ("ib", "roce"):
        adapters = max(1, len(cfg.fabric.hcas))
        listed = "in fabric.hcas" if cfg.fabric.hcas else "(fabric.hcas lists none)"
        text += f"; {counted(adapters, 'adapter')} {listed}"
        gbps *= adapters
    if kind == "ethernet":
        text += "; set parallel.inter_node_gbps"
    return Bandwidth(gbps, text)


def _traffic(dim: str, n: int, plan: ParallelPlan, cfg: Config) -> tuple[float | None, str]:
    """(bytes per rank and step, what moves) or (None, what is missing)."""
    p, d = cfg.parallel, plan.degrees
    b = p.dtype_bytes
    if dim in ("dp_shard", "dp_replicate"):
        if p.model_params is None:
            return None, "needs parallel.model_params"
        local = p.model_params * b / (d.tp * d.pp)
        if dim == "dp_shard":
            return 3 * (n - 1) / n * local, "all-gather params x2, reduce-scatter grads"
        return 2 * (n - 1) / n * local / d.dp_shard, "all-reduce gradient shards"
    if p.hidden_size is None or p.layers is None or p.tokens_per_step is None:
        return None, "needs parallel.hidden_size, layers and tokens_per_step"
    t = p.tokens_per_step / (d.dp * d.cp)
    h, per_stage = p.hidden_size, p.layers / d.pp
    if dim == "tp":
        return 4 * 2 * (n - 1) / n * t * h * b * per_stage, "4 activation all-reduces a layer"
    if dim == "cp":
        return 6 * (n - 1) * t * (h / d.tp) * b * per_stage, "K/V ring, forward and backward"
    return 2 * t * h * b / d.tp, "activations forward, gradients back"


def estimate(plan: ParallelPlan, cfg: Config) -> list[DimCost]:
    """One entry per dimension with more than one rank, innermost (tp) first; with replica
    groups the dimensions of one group's plan, then dp_replicate across the groups."""
    inside, across = intra_node(cfg), inter_node(cfg)
    groups = replica_groups(cfg)
    if groups is None:
        spans = [plan.span(dim) for dim in reversed(plan.names)]
    else:
        inner = [groups.inner.span(dim) for dim in reversed(plan.names) if dim != "dp_replicate"]
        spans = [*inner, groups.span()]
    out = []
    for span in spans:
        dim = span.dim
        if span.size == 1:
            continue
        size, what = _traffic(dim, span.size, plan, cfg)
        if groups is not None and dim == "dp_replicate":
            # Each rank all-reduces its shard with the same rank of every other group, all
            # of a node's ranks at once: the node's network shared, as in HSDP.
            gbps, link = (
                across.gbps / plan.ranks_per_node,
                f"across {counted(groups.count, 'replica group')}",
            )
            what = f"{what} through torchft, per step" if size is not None else what
        elif span.inside_node:
            gbps, link = inside.gbps, "inside a node"
        else:
            gbps = across.gbps / plan.ranks_per_node
            link = f"across {counted(span.nodes, 'node')}"
        out.append(DimCost(dim, span, what, size, gbps, link))
    return out
