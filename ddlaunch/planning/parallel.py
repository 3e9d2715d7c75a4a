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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ddlaunch.config.parallel import DIMS, Degrees, degrees_of, layout_of
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


def ranks_text(ranks: list[int]) -> str:
    """``[0 1]``; long runs as ``[0 1 .. 7]`` (a group of consecutive ranks stays short)."""
    if len(ranks) > 4:
        return f"[{ranks[0]} {ranks[1]} .. {ranks[-1]}]"
    return "[" + " ".join(map(str, ranks)) + "]"
