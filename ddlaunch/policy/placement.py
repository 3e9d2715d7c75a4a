"""Which nodes of the allocation the ranks run on (pure): hot spares and elastic shrink.

A job with ``fault_tolerance.spare_nodes`` or ``nodes.min`` holds more nodes than it may need
(``nodes.count`` + spares) and Slurm keeps it when one fails (``--no-kill``). Each attempt's
srun step then runs on ``nodes.count`` usable nodes of the allocation, in the allocation's
order (the batch host first, so the ranks' rendezvous stays where the script runs); a node
blamed for a failure is not usable again. With fewer usable nodes than ``nodes.count`` but at
least ``nodes.min``, the step runs on all of them: the world size shrinks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddlaunch.wording import counted


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]  # the step's nodes, in the allocation's order
    wanted: int  # nodes.count
    spares: tuple[str, ...]  # usable nodes left out of the step, ready for the next failure

    @property
    def shrunk(self) -> bool:
        return len(self.nodes) < self.wanted


def place(
    allocation: Sequence[str], unusable: Iterable[str], wanted: int, minimum: int | None
) -> Placement | None:
    """The step's nodes: the first ``wanted`` usable nodes of ``allocation``, or all usable
    ones when fewer but at least ``minimum`` (None: no shrink); None when too few are left."""
    bad = set(unusable)
    usable = [n for n in dict.fromkeys(allocation) if n not in bad]
    if len(usable) >= wanted:
        return Placement(tuple(usable[:wanted]), wanted, tuple(usable[wanted:]))
    if usable and minimum is not None and len(usable) >= minimum:
        return Placement(tuple(usable), wanted, ())
    return None


def describe_shortage(
    allocation: Sequence[str], unusable: Iterable[str], wanted: int, minimum: int | None
) -> str:
    """Why ``place`` found no placement, in one line."""
    bad = sorted(set(unusable) & set(allocation))
    left = len(set(allocation)) - len(bad)
    need = wanted if minimum is None else minimum
    return (
        f"{counted(left, 'usable node')} of the allocation's {len(set(allocation))} "
        f"(without {','.join(bad) or 'none'}), {need} needed"
        + (" (nodes.min)" if minimum is not None else " (nodes.count)")
    )
