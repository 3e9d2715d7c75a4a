"""The parallelism plan placed on the nodes (pure, no torch): which ranks form which groups
on which nodes, and what that says for ``render``.

The rank order is ONE rule, ``rank_of``: node by node, in the allocation's order (srun's
block distribution, which the plan asks srun for). The ranks' ``RANK`` follows it
(``worker.distenv`` reads SLURM_PROCID), ``device_mesh()`` checks it against the hosts the
ranks really run on, and the mesh is the ranks in row-major order over ``DIMS`` (pp,
dp_replicate, dp_shard, cp, tp: ``torch.distributed.device_mesh.init_device_mesh``'s own
layout). So tp groups are consecutive ranks on one node, and the outer dimensions stride
across nodes.

Everything here is arithmetic on strides: planning a 16,000-GPU job enumerates no rank
(``benchmarks/bench_parallel_plan.py``); ``groups`` lists a dimension's groups on demand.

With ``fault_tolerance.mode: replica_groups`` dp_replicate is not a mesh dimension of one
world: ``replica_groups`` cuts the nodes into that many groups of consecutive whole nodes, each
its own world holding one replica (the inner plan: dp_replicate 1 on a group's nodes), and
torchft averages across the groups. The job-wide rank of a group's rank r is the group's
offset + r, which is ``rank_of`` again: groups are consecutive nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ddlaunch.config.parallel import DIMS, Degrees, degrees_of, layout_of, replica_mode
from ddlaunch.config.schema import Config


def rank_of(node_index: int, local_rank: int, ranks_per_node: int) -> int:
    """THE rank order: the ranks of node 0, then node 1, ... (srun --distribution=block)."""
    return node_index * ranks_per_node + local_rank


@dataclass(frozen=True)
class Span:
    """How one dimension's groups lie on the nodes (the group of rank 0, which every group
    repeats when the dimension's block is node-aligned)."""

    dim: str
    size: int
    stride: int
    groups: int
    nodes: int  # nodes one group spans
    per_node: int  # ranks of one group on each of those nodes

    @property
    def inside_node(self) -> bool:
        return self.nodes == 1


@dataclass(frozen=True)
class ParallelPlan:
    degrees: Degrees
    nodes: int
    ranks_per_node: int

    names = DIMS

    @property
    def shape(self) -> tuple[int, ...]:
        return self.degrees.shape

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def size(self, dim: str) -> int:
        return int(getattr(self.degrees, dim))

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along ``dim``: the product of the inner sizes."""
        out = 1
        for inner in reversed(DIMS):
            if inner == dim:
                return out
            out *= self.size(inner)
        raise KeyError(dim)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def coords(self, rank: int) -> dict[str, int]:
        return {d: (rank // self.stride(d)) % self.size(d) for d in DIMS}

    def group(self, dim: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group along ``dim``, in mesh order."""
        stride = self.stride(dim)
        base = rank - self.coords(rank)[dim] * stride
        return [base + k * stride for k in range(self.size(dim))]

    def groups(self, dim: str) -> Iterator[list[int]]:
        """Every group along ``dim``, ordered by its first rank."""
        stride, size = self.stride(dim), self.size(dim)
        block = stride * size
        for start in range(0, self.world, block):
            for offset in range(stride):
                yield [start + offset + k * stride for k in range(size)]

    def span(self, dim: str) -> Span:
        size, stride = self.size(dim), self.stride(dim)
        nodes: dict[int, int] = {}
        for k in range(size):
            node = self.node_of(k * stride)
            nodes[node] = nodes.get(node, 0) + 1
        return Span(dim, size, stride, self.world // size, len(nodes), max(nodes.values()))

    def dp_rank(self, rank: int) -> int:
        """Which slice of the data ``rank`` reads: its index among the dp_replicate x
        dp_shard ranks (tp, cp and pp peers read the same slice)."""
        c = self.coords(rank)
        return c["dp_replicate"] * self.size("dp_shard") + c["dp_shard"]


def parallel_plan(cfg: Config) -> ParallelPlan:
    """The plan of a validated config (the default, nothing configured: dp over the world)."""
    layout = layout_of(cfg)
    return ParallelPlan(degrees_of(cfg), layout.nodes, layout.ranks_per_node)


@dataclass(frozen=True)
class ReplicaGroups:
    """``fault_tolerance.mode: replica_groups``: ``count`` groups of ``nodes_per_group``
    consecutive whole nodes (group g holds nodes [g k, (g + 1) k)), each its own world with
    the plan ``inner`` (its ranks numbered from 0), training goes on while ``min_live`` are
    live."""

    count: int
    nodes_per_group: int
    inner: ParallelPlan
    min_live: int

    @property
    def ranks_per_group(self) -> int:
        return self.inner.world

    def nodes(self, group: int) -> range:
        """The job's node indices (allocation order) that ``group`` runs on."""
        first = group * self.nodes_per_group
        return range(first, first + self.nodes_per_group)

    def rank_offset(self, group: int) -> int:
        """The job-wide rank of the group's rank 0."""
        return group * self.ranks_per_group

    def group_of_node(self, node: int) -> int:
        return node // self.nodes_per_group

    def peers(self, rank: int) -> list[int]:
        """The job-wide ranks that torchft averages ``rank``'s gradients with: the same rank
        of every group, ``rank``'s own included, by group."""
        local = rank % self.ranks_per_group
        return [self.rank_offset(g) + local for g in range(self.count)]

    def span(self) -> Span:
        """dp_replicate across the groups, in job-wide ranks: one rank of each group, each
        on its own node."""
        k = self.ranks_per_group
        return Span("dp_replicate", self.count, k, k, self.count, 1)


def replica_groups(cfg: Config) -> ReplicaGroups | None:
    """The groups of a validated config in replica-groups mode; None in job mode."""
    if not replica_mode(cfg):
        return None
    d = degrees_of(cfg)
    layout = layout_of(cfg)
    per_group = layout.nodes // d.dp_replicate
    inner = ParallelPlan(Degrees(d.pp, 1, d.dp_shard, d.cp, d.tp), per_group, layout.ranks_per_node)
    return ReplicaGroups(d.dp_replicate, per_group, inner, cfg.fault_tolerance.min_replica_groups)


def ranks_text(ranks: list[int]) -> str:
    """``[0 1]``; long runs as ``[0 1 .. 7]`` (a group of consecutive ranks stays short)."""
    if len(ranks) > 4:
        return f"[{ranks[0]} {ranks[1]} .. {ranks[-1]}]"
    return "[" + " ".join(map(str, ranks)) + "]"
