"""The job's ``DeviceMesh`` from its ``parallel:`` plan (ranks, torch).

``device_mesh(config)`` joins the process group if needed, checks that the ranks really run
where the plan put them (``planning.parallel.rank_of``: node by node; a tp or cp group on one
host), and builds ``torch.distributed.device_mesh.init_device_mesh`` with the plan's shape and
names, outermost first: ``("pp", "dp_replicate", "dp_shard", "cp", "tp")``. Every dimension is
present, of size 1 when unused, so ``mesh["tp"]`` works whatever the plan. Built once per
process (creating the groups is a collective); later calls return the same mesh.

What torch 2.13 does with these dimensions on CPU/gloo (checked with 4 gloo ranks):
``fully_shard`` on ``mesh["dp_shard"]`` or the 2-D ``mesh["dp_replicate", "dp_shard"]``
(HSDP), ``parallelize_module`` with Colwise/Rowwise/SequenceParallel on ``mesh["tp"]``, DTensor
redistribution (all-to-all falls back to all-gather + chunk: gloo has no all-to-all for CPU
tensors) and ``torch.distributed.pipelining`` over gloo all work. Context parallelism
(``torch.distributed.tensor.experimental.context_parallel``) does not: its ring attention
handles the CUDA SDPA kernels only, and on CPU fails with "Operator
aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered". A cp dimension is planned and built on CPU all the same.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ddlaunch.config import Config, load_config
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.parallel import ParallelPlan, parallel_plan, replica_groups
from ddlaunch.store.rundir import config_path
from ddlaunch.wording import counted
from ddlaunch.worker.distributed import init_distributed

_MESHES: dict[tuple[int, ...], DeviceMesh] = {}


class PlacementError(RuntimeError):
    """The ranks do not run where the plan put them."""


def run_config() -> Config:
    """The resolved config of this run (``$DDLAUNCH_RUN_DIR/config.yaml``)."""
    run_dir = os.environ.get("DDLAUNCH_RUN_DIR")
    if not run_dir:
        raise RuntimeError("device_mesh() without a config needs $DDLAUNCH_RUN_DIR (a job's)")
    return load_config(config_path(Path(run_dir)))


def placement_problems(plan: ParallelPlan, hosts: list[str]) -> list[str]:
    """Where ``hosts`` (host of each rank) contradict the plan: ranks of one node on several
    hosts, or a tp / cp group split across hosts. Pure, for tests."""
    problems = []
    g = plan.ranks_per_node
    for node in range(plan.nodes):
        block = hosts[node * g : (node + 1) * g]
        if len(set(block)) > 1:
            problems.append(
                f"ranks {node * g}-{(node + 1) * g - 1} (node {node} of the plan) run on "
                f"{', '.join(sorted(set(block)))}"
            )
    for dim in ("tp", "cp"):
        if plan.size(dim) == 1 or not plan.span(dim).inside_node:
            continue
        for group in plan.groups(dim):
            where = {hosts[r] for r in group}
            if len(where) > 1:
                problems.append(f"{dim} group {group} spans {', '.join(sorted(where))}")
                break
    return problems


def check_placement(plan: ParallelPlan) -> list[str]:
    """Every rank's host (a collective); raises PlacementError when they contradict the
    plan. Returns the hosts, by rank."""
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    problems = placement_problems(plan, hosts)
    if problems:
        raise PlacementError(
            "ranks are not placed as planned (ddlaunch places ranks node by node: srun "
            "--distribution=block; is SLURM_DISTRIBUTION set?): " + "; ".join(problems)
        )
    return hosts


def mesh_plan(cfg: Config, environ: Mapping[str, str]) -> ParallelPlan:
    """The plan this rank's world holds: the job's, or, in a replica group (its own world),
    the group's inner plan (dp_replicate 1: the groups meet through torchft, not the mesh)."""
    groups = replica_groups(cfg)
    if groups is not None and GroupIdentity.from_env(environ) is not None:
        return groups.inner
    return parallel_plan(cfg)


def device_mesh(config: Config | None = None) -> DeviceMesh:
    """The job's mesh over the plan of ``config`` (default: the run's own config); in a
    replica group, the group's."""
    cfg = config if config is not None else run_config()
    backend = init_distributed()
    plan = mesh_plan(cfg, os.environ)
    world = dist.get_world_size()
    if plan.world != world:
        raise PlacementError(
            f"the parallel plan is for {counted(plan.world, 'rank')} "
            f"({counted(plan.nodes, 'node')} x {plan.ranks_per_node}), but this job has {world}"
        )
    mesh = _MESHES.get(plan.shape)
    if mesh is None:
        check_placement(plan)
        device = "cuda" if backend == "nccl" else "cpu"
        mesh = init_device_mesh(device, plan.shape, mesh_dim_names=plan.names)
        _MESHES[plan.shape] = mesh
    return mesh


def forget() -> None:
    """Drop the meshes built so far: their groups are gone (an in-process restart), the
    next ``device_mesh()`` builds the mesh anew over the new groups."""
    _MESHES.clear()
