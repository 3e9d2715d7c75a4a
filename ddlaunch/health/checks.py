"""Node checks (compute node, torch-free, seconds): GPUs visible vs requested, free space in
the checkpoint directory and scratch, whether torch imports, and (for ``ddlaunch doctor``)
the node's fabric compared with its profile where the tools exist. The facts come from the
node; the verdicts are pure (``ddlaunch.policy.preflight``).

Testing hook: ``$DDLAUNCH_HEALTH_INJECT`` holds a JSON list of overrides, each applied to the
node named by ``node`` (host name) or ``index`` (position in the allocation), optionally only
at ``restart`` N: ``free_gb`` (every checked path), ``gpus`` (GPUs assigned), ``torch_error``,
``stage_kill_after_files`` (the data staging's leader SIGKILLs itself, ``worker.stage``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ddlaunch.planning.staging import node_path
from ddlaunch.policy import fabric as fabric_check
from ddlaunch.policy import preflight as v
from ddlaunch.runner import Runner
from ddlaunch.slurm.parse import het_group_of
from ddlaunch.store.layout import CHECKPOINTS_DIR

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config

INJECT_VAR = "DDLAUNCH_HEALTH_INJECT"


def injection(spec: str | None, host: str, index: int, restart: int) -> dict[str, object]:
    """The overrides of ``$DDLAUNCH_HEALTH_INJECT`` that apply to this node and attempt (a
    JSON object or list of them, from the tests: each override is read by its user)."""
    if not spec:
        return {}
    try:
        items = json.loads(spec)
    except ValueError:
        return {}
    merged: dict[str, object] = {}
    for item in items if isinstance(items, list) else [items]:
        if not isinstance(item, dict):
            continue
        if "node" in item and item["node"] != host:
            continue
        if "index" in item and int(item["index"]) != index:
            continue
        if "restart" in item and int(item["restart"]) != restart:
            continue
        merged.update({k: val for k, val in item.items() if k not in ("node", "index", "restart")})
    return merged


def assigned_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs Slurm gave this step: CUDA_VISIBLE_DEVICES, else the gres variables."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is None:
            continue
        value = value.strip()
        if value in ("", "NoDevFiles"):
            return 0
        return len([x for x in value.split(",") if x.strip()])
    value = env.get("SLURM_GPUS_ON_NODE")
    return int(value) if value and value.isdigit() else None


def nvidia_smi(runner: Runner) -> tuple[int | None, str | None]:
    """(GPUs listed, error) from ``nvidia-smi -L``; (None, None) when it is not installed."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    result = runner.run(["nvidia-smi", "-L"], timeout=60)
    if not result.ok:
        detail = (result.stderr or result.stdout).strip().splitlines()
        return None, detail[-1] if detail else f"exit {result.returncode}"
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU ")), None


def free_gb(path: str) -> tuple[float | None, str]:
    """Free space for an unprivileged writer at ``path`` (or its nearest existing parent: the
    checkpoint directory may not exist before the first save)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return None, str(exc)
    return st.f_bavail * st.f_frsize / 1e9, ""


def checked_paths(cfg: Config, run_dir: Path, env: Mapping[str, str]) -> list[tuple[str, str]]:
    ckpt = env.get("DDLAUNCH_CHECKPOINT_DIR") or cfg.storage.checkpoint_dir
    paths = [("checkpoints", ckpt or str(run_dir / CHECKPOINTS_DIR))]
    scratch = env.get("DDLAUNCH_SCRATCH") or cfg.storage.scratch
    if scratch:
        # {node}: the rank exported it filled in already; a bare node task fills it here.
        paths.append(("scratch", node_path(os.path.expandvars(scratch), socket.gethostname())))
    return paths


def expected_gpus(cfg: Config, env: Mapping[str, str], host: str | None = None) -> int:
    """The GPUs this node should have: ``nodes.gpus_per_node``, or in a heterogeneous job
    (``components:``) its own component's, which may differ (a service without GPUs; the
    train components all have the configured count): Slurm tells every task each group's
    nodes and GPUs per node (``SLURM_JOB_NODELIST_HET_GROUP_<k>``,
    ``SLURM_GPUS_PER_NODE_HET_GROUP_<k>`` as ``[type:]count``, absent: none)."""
    group = het_group_of(env, host or socket.gethostname())
    if group is None:
        return cfg.nodes.gpus_per_node
    count = env.get(f"SLURM_GPUS_PER_NODE_HET_GROUP_{group}", "0").rpartition(":")[2]
    return int(count) if count.isdigit() else 0


def node_checks(
    cfg: Config, run_dir: Path, env: Mapping[str, str], runner: Runner, inject: Mapping[str, object]
) -> tuple[list[v.Check], dict[str, object]]:
    """The torch-free part of phase 1 (GPUs, free space); returns the checks and the facts
    behind them. The in-rank preflight (``ddlaunch.worker.gate``) runs it before torch."""
    facts: dict[str, object] = {}
    assigned = assigned_gpus(env)
    smi_count, smi_error = nvidia_smi(runner)
    if "gpus" in inject:
        assigned = int(_number(inject["gpus"]))
        smi_count = min(smi_count, assigned) if smi_count is not None else None
    facts["gpus"] = {"assigned": assigned, "nvidia_smi": smi_count, "error": smi_error}
    checks = [v.gpu_check(expected_gpus(cfg, env), assigned, smi_count, smi_error)]
    for label, path in checked_paths(cfg, run_dir, env):
        free, error = free_gb(path)
        if "free_gb" in inject:
            free, error = _number(inject["free_gb"]), ""
        facts[f"free_gb:{label}"] = free
        checks.append(v.disk_check(label, path, free, cfg.health.min_free_gb, error))
    return checks, facts


def _number(value: object) -> float:
    """An injected number (``gpus``, ``free_gb``)."""
    if isinstance(value, int | float | str):
        return float(value)
    raise ValueError(f"{INJECT_VAR}: {value!r} is not a number")


def doctor_findings(cfg: Config, runner: Runner) -> list[dict[str, str]]:
    """``ddlaunch doctor``: compare the node with its fabric profile where the tools exist."""
    outputs: dict[str, str | None] = {}
    for key, argv in fabric_check.COMMANDS.items():
        if shutil.which(argv[0]) is None:
            outputs[key] = None
            continue
        result = runner.run(list(argv), timeout=30)
        outputs[key] = result.stdout if result.ok else None
    try:
        findings = fabric_check.check_node(cfg, outputs)
    except Exception as exc:  # a parser bug must not hide the other checks
        return [{"check": "fabric", "status": "unchecked", "detail": f"fabric_check failed: {exc}"}]
    return [{"check": f.check, "status": str(f.status), "detail": f.detail} for f in findings]
