"""Which nodes to blame when an attempt's ranks failed (batch host, torch-free): the nodes
Slurm reports as bad, and nodes whose ranks died silently (no failure record: killed, not
raised) and whose slurmd no longer answers, seconds before slurmctld declares them down.

At 2,000 nodes this stays a handful of Slurm calls whatever the number of suspects: one
sinfo for every node's state, one ``scontrol show config`` for slurmd's port, one
``scontrol show node`` for every suspect's address; the TCP probes run in parallel
(``PROBE_THREADS`` at a time, each bounded by its own timeout). Ranks srun reported as ended
by the step's teardown say nothing about their node and make none a suspect.

``dead_nodes`` is the node-death check the replica-group supervisor runs on a group's
nodes; ``blame_nodes`` runs its two halves (Slurm's states, then slurmd probes) on an
attempt's suspects."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddlaunch.policy.attribution import StepLog, torn_down
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.slurm.parse import node_is_bad
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import read_failures


def expand(nodelist: str) -> list[str]:
    return expand_hostlist(nodelist) if nodelist else []


def bad_nodes(states: dict[str, str]) -> list[str]:
    return sorted(n for n, s in states.items() if node_is_bad(s))


def recorded_ranks(run_dir: Path, attempt: AttemptId) -> set[int]:
    """Ranks of this attempt that wrote a failure record (raised). The ranks name their job
    as Slurm addresses it (``ARRAY_TASK`` in an array), which is ``attempt.task``."""
    names = {attempt.job_id, attempt.task}
    return {
        f.rank
        for f in read_failures(run_dir)
        if str(f.job_id) in names
        and (f.attempt or 0) == attempt.restart
        and f.relaunch == attempt.relaunch
    }


def slurmd_reachable(address: str, port: int, timeout: float = 3.0) -> bool:
    """A TCP connect to the node's slurmd: refused or timed out means the node is gone,
    seconds before slurmctld declares it down (SlurmdTimeout)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


# Probes at once: 2,000 unreachable nodes cost ceil(2000 / 64) x the connect timeout (~1.5 min
# at 3 s) instead of 100 min one after another, without opening 2,000 sockets at once.
PROBE_THREADS = 64


def probe_all(addresses: Sequence[str], port: int, timeout: float = 3.0) -> list[bool]:
    """``slurmd_reachable`` of each address, in parallel (in the addresses' order)."""
    if len(addresses) <= 1:
        return [slurmd_reachable(a, port, timeout) for a in addresses]
    with ThreadPoolExecutor(max_workers=min(PROBE_THREADS, len(addresses))) as pool:
        return list(pool.map(lambda a: slurmd_reachable(a, port, timeout), addresses))


def unreachable(client: SlurmClient, nodes: Sequence[str], timeout: float = 3.0) -> dict[str, str]:
    """The nodes whose slurmd does not answer, each with the address probed
    (``address:port``): one ``scontrol show config`` for the port, one ``scontrol show
    node`` for the addresses, the probes in parallel. None probed when there are no nodes
    or Slurm names no port."""
    port = client.slurmd_port() if nodes else None
    if not port:
        return {}
    known = client.node_addresses(list(nodes))
    addresses = [known.get(node) or node for node in nodes]
    found = probe_all(addresses, port, timeout)
    return {
        node: f"{address}:{port}"
        for node, address, up in zip(nodes, addresses, found, strict=True)
        if not up
    }


def dead_nodes(client: SlurmClient, nodes: Sequence[str], timeout: float = 3.0) -> list[str]:
    """The node-death check: the nodes Slurm reports bad, and the others whose slurmd does
    not answer (``unreachable``). A failed state query counts no node bad (the probes
    still run): the replica-group supervisor asks every second, and one slow answer of
    slurmctld must not end a group."""
    try:
        bad = set(bad_nodes(client.node_states(list(nodes))))
    except Exception:
        bad = set()
    return sorted(bad | set(unreachable(client, [n for n in nodes if n not in bad], timeout)))


def blame_nodes(
    run_dir: Path,
    nodes: Sequence[str],
    attempt: AttemptId,
    client: SlurmClient,
    ranks_per_node: int,
    step: StepLog | None = None,
) -> tuple[list[str], str]:
    """Nodes to blame for a failed srun: reported bad by Slurm, or hosting ranks that died
    silently and whose slurmd no longer answers. ``step``: srun's reports of the step, when
    read; the ranks its teardown ended make no node a suspect (``policy.torn_down``).
    Returns (nodes, explanation)."""
    if not nodes:
        return [], ""
    states = client.node_states(nodes)
    bad = {n: f"{n} {s}" for n, s in states.items() if node_is_bad(s)}
    recorded = recorded_ranks(run_dir, attempt)
    spared = torn_down(step, recorded) if step is not None else frozenset()
    silent = (r for r in range(len(nodes) * ranks_per_node) if r not in recorded)
    suspects = sorted({nodes[r // ranks_per_node] for r in silent if r not in spared} - set(bad))
    for node, where in unreachable(client, suspects).items():
        bad[node] = f"{node} slurmd unreachable at {where}"
    return sorted(bad), ", ".join(bad[n] for n in sorted(bad))
