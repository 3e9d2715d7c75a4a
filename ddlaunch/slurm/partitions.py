"""What a job can ask of the cluster, from one ``sinfo`` call (pure parser).

``sinfo -h -a -N -o '%N|%P|%G|%c|%l|%s'`` prints one line per node and partition: node,
partition (``*`` marks the default), GRES (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``(null)``),
CPUs, the partition's time limit (``infinite``, ``1-00:00:00``, ``30:00``) and job size in
nodes (``1-infinite``, ``1-4``). Recorded on 22.05 in ``tests/fixtures/slurm-22.05``. ``-a``
includes hidden partitions and those of other groups, so a named partition is found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SINFO_ARGV = ("sinfo", "-h", "-a", "-N", "-o", "%N|%P|%G|%c|%l|%s")

_GPU = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")
_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$|^(\d+)$")


@dataclass(frozen=True)
class PartitionFacts:
    """One partition: its nodes with their GPUs and CPUs, and its limits (None: none)."""

    name: str
    nodes: tuple[str, ...]
    gpus: tuple[int, ...]  # per node, in the order of ``nodes``
    cpus: tuple[int, ...]
    max_nodes: int | None = None
    max_time_s: int | None = None
    default: bool = False

    def gpus_of(self, node: str) -> int:
        return dict(zip(self.nodes, self.gpus, strict=True)).get(node, 0)


def parse_time_limit(text: str) -> int | None:
    """sinfo's ``%l``: seconds, or None for ``infinite`` / ``UNLIMITED`` / unparsable."""
    match = _TIME.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds, only = match.groups()
    if only is not None:
        return int(only) * 60  # a bare number is minutes, as in --time
    if hours is None and days is None:
        return int(minutes) * 60 + int(seconds)  # MM:SS
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)


def _max_nodes(size: str) -> int | None:
    top = size.strip().rpartition("-")[2]
    return int(top) if top.isdigit() else None


def gpu_count(gres: str) -> int:
    return sum(int(n) for n in _GPU.findall(gres))


def parse_sinfo_partitions(stdout: str) -> list[PartitionFacts]:
    """``SINFO_ARGV``'s output -> one ``PartitionFacts`` per partition, in sinfo's order."""
    order: list[str] = []
    rows: dict[str, list[tuple[str, int, int]]] = {}
    limits: dict[str, tuple[int | None, int | None, bool]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        node, partition, gres, cpus, time_limit, size = parts
        default = partition.endswith("*")
        name = partition.rstrip("*")
        if name not in rows:
            order.append(name)
            rows[name] = []
            limits[name] = (_max_nodes(size), parse_time_limit(time_limit), default)
        if all(n != node for n, _, _ in rows[name]):
            count = int(cpus) if cpus.isdigit() else 0
            rows[name].append((node, gpu_count(gres), count))
    out = []
    for name in order:
        max_nodes, max_time, default = limits[name]
        nodes = rows[name]
        out.append(
            PartitionFacts(
                name=name,
                nodes=tuple(n for n, _, _ in nodes),
                gpus=tuple(g for _, g, _ in nodes),
                cpus=tuple(c for _, _, c in nodes),
                max_nodes=max_nodes,
                max_time_s=max_time,
                default=default,
            )
        )
    return out
