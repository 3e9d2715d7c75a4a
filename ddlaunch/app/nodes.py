"""My bad-node list as use cases (``ddlaunch nodes``): list it, add nodes (checked against
the cluster), remove them, clear it. The values come back typed; the CLI prints them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.errors import UserError
from ddlaunch.slurm.hostlist import compress_hostlist
from ddlaunch.store import badnodes
from ddlaunch.store.badnodes import BadNode as BadNode  # the entries' type, for the CLI
from ddlaunch.store.badnodes import parse_ttl as parse_ttl  # durations: 30m, 12h, 2d, never


@dataclass(frozen=True)
class NodeList:
    """The list as ``nodes list`` shows it: the entries to show, the suspects (one run's
    hang each, not yet excluded), where the list lives and the time they were judged at."""

    shown: tuple[BadNode, ...]
    suspects: tuple[BadNode, ...]
    path: Path
    now: float


@dataclass(frozen=True)
class Added:
    names: tuple[str, ...]
    expires: float | None  # None: never
    path: Path
    now: float


def list_nodes(show_all: bool = False) -> NodeList:
    """The active entries (every one with ``show_all``) and the suspects."""
    now = time.time()
    entries = badnodes.load()
    shown = entries if show_all else badnodes.active(entries, now)
    suspects = badnodes.suspects(entries, now)
    return NodeList(tuple(shown), tuple(suspects), badnodes.default_path(), now)


def add_nodes(
    nodes: Sequence[str],
    reason: str,
    ttl: str,
    force: bool,
    warn: Callable[[str], None] = lambda line: None,
) -> Added:
    """Add ``nodes`` (Slurm hostlists expanded) for ``ttl``. The names must be Slurm tokens
    (they end up in an #SBATCH --exclude line) and, unless ``force``, known to the cluster
    (one sinfo call; ``warn`` is told when Slurm could not be asked)."""
    from ddlaunch.config.schema import PATTERNS
    from ddlaunch.slurm.hostlist import expand_hostlist

    try:
        ttl_s = parse_ttl(ttl)
        names = [n for spec in nodes for n in expand_hostlist(spec)]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # The names end up in an #SBATCH --exclude line: only Slurm tokens are safe there.
    pattern, expected = PATTERNS["slurm_token"]
    bad = [n for n in names if not pattern.match(n)]
    if bad:
        raise UserError(f"node name {bad[0]!r} must be {expected}")
    _check_known(names, force, warn)
    now = time.time()
    path = badnodes.save(
        badnodes.add(badnodes.load(), names, reason=reason, now=now, ttl_s=ttl_s, source="user")
    )
    return Added(tuple(names), now + ttl_s if ttl_s else None, path, now)


def _check_known(names: list[str], force: bool, warn: Callable[[str], None]) -> None:
    from ddlaunch.app.facts import probe
    from ddlaunch.planning.feasibility import unknown_nodes

    facts, warnings = probe()
    for line in warnings:
        warn(line)
    if not facts.partitions:
        return
    unknown = unknown_nodes(facts.partitions, names)
    if unknown and not force:
        known = compress_hostlist(n for p in facts.partitions for n in p.nodes)
        raise UserError(
            f"{', '.join(unknown)}: no such node in this cluster (it has {known}); "
            "--force adds it anyway"
        )


def remove_nodes(nodes: Sequence[str]) -> list[str]:
    """Remove ``nodes`` (hostlists expanded); the names that were listed, sorted."""
    from ddlaunch.slurm.hostlist import expand_hostlist

    names = [n for spec in nodes for n in expand_hostlist(spec)]
    entries = badnodes.load()
    kept = badnodes.remove(entries, names)
    badnodes.save(kept)
    return sorted({e.node for e in entries} - {e.node for e in kept})


def clear_nodes() -> int:
    """Empty the list; how many entries it had."""
    count = len(badnodes.load())
    badnodes.save([])
    return count
