"""``excluded_nodes.json``: the nodes this run keeps out of its later attempts (blamed for a
node failure, a failed preflight, a hang or a straggler); ``blame.json``: when and why each
was added. ``leave_out``: the one way a node failure, wherever it is found, keeps the node out
of this run and (the bad-node list) out of the user's later runs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store import badnodes, records

EXCLUDED_FILE = "excluded_nodes.json"
BLAME_FILE = "blame.json"


def excluded(run_dir: Path) -> list[str]:
    """The run's excluded nodes; a file that cannot be used counts as none."""
    found, _ = records.load_json(run_dir / EXCLUDED_FILE, list, [])
    return [node for node in found if isinstance(node, str)]


def add_excluded(run_dir: Path, nodes: Iterable[str], reason: str) -> list[str]:
    """Add ``nodes`` (with the reason, to the blame log); returns the whole list."""
    nodes = sorted(set(nodes))
    current = excluded(run_dir)
    merged = sorted(set(current) | set(nodes))
    if merged != current:
        fsutil.atomic_write_json(run_dir / EXCLUDED_FILE, merged, 0o600)
        log, _ = records.load_json(run_dir / BLAME_FILE, list, [])
        log.append({"time": time.time(), "nodes": nodes, "reason": reason})
        fsutil.atomic_write_json(run_dir / BLAME_FILE, log, 0o600)
    return merged


def leave_out(run_dir: Path, nodes: Iterable[str], why: str, bad_node_ttl_hours: float) -> None:
    """A node failure: keep ``nodes`` out of this run's later attempts (its exclusions) and,
    being evidence about the node, for ``bad_node_ttl_hours`` out of the user's later runs
    (the bad-node list: the user's file, so best effort). Every place that finds a node dead
    takes this one path: the end hook, the start hook of a cut-off attempt, the guard, the
    replica groups' supervisor and the in-process restart."""
    names = list(nodes)
    add_excluded(run_dir, names, why)
    with contextlib.suppress(Exception):  # a job must never fail on the user's list
        badnodes.record(names, why, bad_node_ttl_hours, f"run {run_dir.name}")
