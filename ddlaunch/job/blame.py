"""Which nodes to blame when an attempt's ranks failed (batch host, torch-free): the nodes
Slurm reports as bad, and nodes whose ranks died silently (no failure record: killed, not
raised) and whose slurmd no longer answers, seconds before slurmctld declares them down."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.slurm.parse import node_is_bad
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import read_failures


def expand(nodelist: str) -> list[str]:
    return expand_hostlist(nodelist) if nodelist else []


def bad_nodes(states: dict[str, str]) -> list[str]:
    return sorted(n for n, s in states.items() if node_is_bad(s))


def silent_ranks(run_dir: Path, attempt: AttemptId, world_size: int) -> list[int]:
    """Ranks of this attempt that died without writing a failure record (killed, not
    raised): their node is a suspect. The ranks name their job as Slurm addresses it
    (``ARRAY_TASK`` in an array), which is ``attempt.task``."""
    names = {attempt.job_id, attempt.task}
    recorded = {
        f.rank
        for f in read_failures(run_dir)
        if str(f.job_id) in names
        and (f.attempt or 0) == attempt.restart
        and f.relaunch == attempt.relaunch
    }
    return [r for r in range(world_size) if r not in recorded]


def slurmd_reachable(address: str, port: int, timeout: float = 3.0) -> bool:
    """A TCP connect to the node's slurmd: refused or timed out means the node is gone,
    seconds before slurmctld declares it down (SlurmdTimeout)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def blame_nodes(
    run_dir: Path,
    nodes: Sequence[str],
    attempt: AttemptId,
    client: SlurmClient,
    ranks_per_node: int,
) -> tuple[list[str], str]:
    """Nodes to blame for a failed srun: reported bad by Slurm, or hosting ranks that died
    silently and whose slurmd no longer answers. Returns (nodes, explanation)."""
    if not nodes:
        return [], ""
    states = client.node_states(nodes)
    bad = {n: f"{n} {s}" for n, s in states.items() if node_is_bad(s)}
    silent = silent_ranks(run_dir, attempt, len(nodes) * ranks_per_node)
    suspects = sorted({nodes[r // ranks_per_node] for r in silent} - set(bad))
    if suspects:
        port = client.slurmd_port()
        for node in suspects:
            address = client.node_address(node) or node
            if port and not slurmd_reachable(address, port):
                bad[node] = f"{node} slurmd unreachable at {address}:{port}"
    return sorted(bad), ", ".join(bad[n] for n in sorted(bad))
