"""The nodes of the next srun step inside the allocation (batch host, torch-free):
``python -m ddlaunch.job.hooks place`` prints them for the batch script of a job with hot
spares or ``nodes.min`` (``policy.placement`` chooses). Unusable: the nodes this run
excluded (blamed for a failure) and those Slurm reports as bad now."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path

from ddlaunch.job.blame import bad_nodes, expand
from ddlaunch.policy.placement import Placement, describe_shortage, place
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import exclusions
from ddlaunch.wording import counted

# Set by the batch script for each step of a job with spares or nodes.min: the step's nodes
# (the attempt record, the watchdog and the in-rank preflight use them, not the allocation's).
STEP_NODES_VAR = "DDLAUNCH_STEP_NODELIST"


# Set by the batch script of a heterogeneous job (components:): the train components' nodes,
# which are the ranks' allocation (SLURM_JOB_NODELIST names the first component's only).
TRAIN_NODES_VAR = "DDLAUNCH_TRAIN_NODELIST"


def allocation(env: Mapping[str, str]) -> str:
    """The nodes the ranks may run on: the job's, or a heterogeneous job's train nodes."""
    return env.get(TRAIN_NODES_VAR) or env.get("SLURM_JOB_NODELIST", "")


def step_nodelist(env: Mapping[str, str]) -> str:
    """The nodes this attempt's ranks run on: the step's, else the whole allocation's."""
    return env.get(STEP_NODES_VAR) or env.get("SLURM_JOB_NODELIST", "")


def unusable(run_dir: Path, allocation: list[str], client: SlurmClient) -> set[str]:
    bad = set(exclusions.excluded(run_dir))
    # Slurm unreachable: the run's own exclusions still hold.
    with contextlib.suppress(Exception):
        bad |= set(bad_nodes(client.node_states(allocation)))
    return bad


def next_placement(
    run_dir: Path, env: Mapping[str, str], client: SlurmClient, wanted: int, minimum: int | None
) -> tuple[Placement | None, str]:
    """(placement, why none) for the next step, from the job's node list."""
    nodes = expand(allocation(env))
    bad = unusable(run_dir, nodes, client)
    found = place(nodes, bad, wanted, minimum)
    return found, "" if found else describe_shortage(nodes, bad, wanted, minimum)


def print_placement(
    run_dir: Path, env: Mapping[str, str], client: SlurmClient, wanted: int, minimum: int | None
) -> int:
    """``hooks place``: the next step's nodes, their count and the hot spares left (``-``
    for none), one line for the batch script (``node1,node3 2 node4``); exit 1, saying why,
    when too few usable nodes are left."""
    found, why = next_placement(run_dir, env, client, wanted, minimum)
    if found is None:
        print(f"[ddlaunch] no placement for the ranks: {why}", file=sys.stderr, flush=True)
        return 1
    print(f"{','.join(found.nodes)} {len(found.nodes)} {','.join(found.spares) or '-'}", flush=True)
    return 0


def placement_fields(
    run_dir: Path,
    env: Mapping[str, str],
    nodes: str,
    wanted: int,
    minimum: int | None,
    ranks_per_node: int,
) -> dict[str, object]:
    """What an attempt of a job with spares or nodes.min records of its placement: the
    allocation, its spares (usable nodes the step leaves out), its world size and, on fewer
    nodes than nodes.count, the shrink (``status`` shows it: the global batch changed)."""
    used = expand(nodes)
    left_out = set(used) | set(exclusions.excluded(run_dir))
    world = len(used) * ranks_per_node
    fields: dict[str, object] = {
        "allocation": allocation(env),
        "spares": [n for n in expand(allocation(env)) if n not in left_out],
        "world_size": world,
    }
    if len(used) < wanted:
        fields["shrunk"] = (
            f"{len(used)} of {counted(wanted, 'node')} (nodes.min={minimum}), world size {world} "
            f"instead of {wanted * ranks_per_node}: the global batch changes"
        )
    return fields
