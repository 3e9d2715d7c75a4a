"""Node checks (compute node, torch-free): fault injection, assigned GPUs, local checks."""

from __future__ import annotations

import json
from pathlib import Path

from support.fakes import FakeRunner
from support.rundirs import example_run_dir

from ddlaunch.health import checks
from ddlaunch.policy.preflight import CheckStatus
from ddlaunch.worker import node_task


def test_injection_matches_node_index_and_restart() -> None:
    spec = json.dumps([{"index": 1, "restart": 0, "free_gb": 0}, {"node": "n3", "gpus": 1}])
    assert checks.injection(spec, "n2", 1, 0) == {"free_gb": 0}
    assert checks.injection(spec, "n2", 1, 1) == {}
    assert checks.injection(spec, "n3", 2, 5) == {"gpus": 1}
    assert checks.injection("not json", "n", 0, 0) == {}


def test_assigned_gpus() -> None:
    assert checks.assigned_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert checks.assigned_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
    assert checks.assigned_gpus({"SLURM_JOB_GPUS": "2,3,4"}) == 3
    assert checks.assigned_gpus({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert checks.assigned_gpus({}) is None


def test_local_checks_with_injected_faults(tmp_path: Path) -> None:
    from ddlaunch.config import load_config

    run_dir = example_run_dir(tmp_path)
    cfg = load_config(run_dir / "config.yaml")
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "DDLAUNCH_SCRATCH": str(tmp_path)}
    found, facts = node_task.local_checks(
        cfg, run_dir, env, FakeRunner(), {"free_gb": 0.5, "gpus": 1, "torch_error": "boom"}
    )
    by = {c.name: c for c in found}
    assert by["gpus"].status == CheckStatus.FAIL
    assert by["disk:checkpoints"].status == by["disk:scratch"].status == CheckStatus.FAIL
    assert by["torch"].detail == "import torch failed: boom"
    assert facts["gpus"]["assigned"] == 1
