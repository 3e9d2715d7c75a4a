"""``excluded_nodes.json``: the nodes this run keeps out of its later attempts (blamed for a
node failure, a failed preflight, a hang or a straggler); ``blame.json``: when and why each
was added."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store import records

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
