"""Validation of the ``sbatch:`` escape hatch: option names (well formed, not one the schema
owns), values that ``#SBATCH`` lines can carry, and a ``gres`` of GPUs beside the
``--gpus-per-node`` ddlaunch writes. Called by ``validate.check_contradictions`` with its issue
collector."""

from __future__ import annotations

import re

from ddlaunch.config import components
from ddlaunch.config.container_rules import Collector
from ddlaunch.config.errors import describe_value
from ddlaunch.config.load import KeyPath
from ddlaunch.config.schema import PATTERNS, Config

# Options that the schema owns: setting them through the escape hatch would fight the
# rendered script, so the error names the key to use instead.
_RESERVED_SBATCH = {
    "job-name": "job.name",
    "partition": "job.partition",
    "account": "job.account",
    "qos": "job.qos",
    "time": "job.time",
    "nodes": "nodes.count",
    "ntasks-per-node": "nodes.gpus_per_node / nodes.tasks_per_node",
    "gpus-per-node": "nodes.gpus_per_node",
    "cpus-per-task": "nodes.cpus_per_task",
    "output": "(ddlaunch writes logs to the run dir)",
    "error": "(ddlaunch writes logs to the run dir)",
    "signal": "fault_tolerance.signal",
    "requeue": "job.requeue",
    "no-requeue": "job.requeue",
    "open-mode": "(always append)",
    "array": "a sweep file",
    "exclude": "nodes.exclude",
    "nodelist": "nodes.nodelist",
    "mem": "nodes.mem",
    "mem-per-cpu": "nodes.mem_per_cpu",
    "mem-per-gpu": "nodes.mem_per_gpu",
    "chdir": "launch.workdir",
    "dependency": "job.dependency",
}


def check_sbatch(cfg: Config, b: Collector) -> None:
    opt_pattern, opt_expected = PATTERNS["sbatch_option"]
    for option, value in cfg.sbatch.items():
        path = ("sbatch", str(option))
        if not opt_pattern.match(str(option)):
            b.fail(path, f"must be {opt_expected}")
        elif option in _RESERVED_SBATCH:
            b.fail(path, f"is set by ddlaunch; use {_RESERVED_SBATCH[option]} instead")
        elif isinstance(value, bool) or value is None:
            continue
        elif not isinstance(value, str | int | float):
            b.fail(path, f"expected a string, number or true, got {describe_value(value)}")
        elif re.search(r"[\x00-\x1f\x7f'\"\\`$]", str(value)):
            # sbatch reads #SBATCH lines itself; quotes and control characters there
            # cannot be made inert by shell quoting.
            b.fail(path, "must not contain quotes, backslashes, $, ` or control characters")
    _gres_gpu_rule(cfg, b)


def _gpus_per_node_asked(cfg: Config) -> tuple[int, KeyPath]:
    """The GPUs per node ddlaunch itself asks for (``--gpus-per-node``) in the block of
    ``#SBATCH`` lines that the ``sbatch:`` entries join, and the key that says so: the job's
    (``planning.plan``), or a heterogeneous job's first component's, whose block the job-wide
    lines follow (``planning.components``: a service asks only for what it names)."""
    if not cfg.components:
        return cfg.nodes.gpus_per_node, ("nodes", "gpus_per_node")
    first = cfg.components[0]
    own = ("components", "0", "nodes", "gpus_per_node")
    if first.role != components.TRAIN:
        return first.nodes.gpus_per_node or 0, own
    gpus = components.gpus_of(first, cfg.nodes.gpus_per_node)
    return gpus, own if first.nodes.gpus_per_node is not None else ("nodes", "gpus_per_node")


def _gres_gpu_rule(cfg: Config, b: Collector) -> None:
    """``sbatch.gres`` naming ``gpu`` beside the ``--gpus-per-node`` ddlaunch writes: both ask
    for the node's GPUs, and from 26.05 sbatch refuses the two together ("--gpus-per-node
    and --gres=gpu are mutually exclusive"; older versions took both). Without GPUs asked
    (``gpus_per_node: 0``, a CPU job) there is no --gpus-per-node and the gres stands."""
    value = cfg.sbatch.get("gres")
    if not isinstance(value, str):
        return
    gpus, key = _gpus_per_node_asked(cfg)
    if not gpus:
        return
    entries = [e.strip() for e in value.split(",") if e.strip()]
    # "gpu", "gpu:4", "gpu:a100:4" (and the "gres/gpu:4" spelling): the name before the colon.
    named = [e for e in entries if e.split(":", 1)[0].removeprefix("gres/") == "gpu"]
    if not named:
        return
    rest = [e for e in entries if e not in named]
    todo = f"keep only its other entries (gres: {','.join(rest)})" if rest else "drop sbatch.gres"
    b.fail(
        ("sbatch", "gres"),
        f"names {','.join(named)}, and {'.'.join(key)}={gpus} asks for the node's GPUs too "
        "(ddlaunch writes --gpus-per-node): Slurm 26.05's sbatch refuses --gres=gpu beside "
        f"--gpus-per-node; {todo}",
        also=key,
    )
