"""The in-rank preflight gate (one real rank with gloo): a failing node stops every rank
before training, with the verdict recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.rundirs import attempt_json, example_run_dir, write_attempts

from ddlaunch.config import load_config
from ddlaunch.health.checks import INJECT_VAR
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker import gate
from ddlaunch.worker.distenv import from_environ


def test_gate_fails_every_rank_before_training_and_records_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank, one node whose checkpoint directory is full: the gate records the verdict,
    the attempt's preflight and the gate record, then raises instead of training."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    run_dir = example_run_dir(tmp_path)
    env = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "41",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_TASKS_PER_NODE": "1",
        "DDLAUNCH_MASTER_PORT": str(29000 + os.getpid() % 1000),
        INJECT_VAR: json.dumps([{"index": 0, "free_gb": 0}]),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    d = from_environ(env)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(d.master_port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    write_attempts(run_dir, [{"attempt": 0, "job_id": "41", "nodes": "node1", "restart_count": 0}])
    cfg = load_config(run_dir / "config.yaml")
    assert gate.enabled(cfg, env)
    report = gate.node_phase(cfg, run_dir, d, env, "node1")
    gate.import_torch(run_dir, env, report)
    try:
        with pytest.raises(gate.PreflightFailed) as failed:
            gate.check(cfg, run_dir, d, env, report, "gloo", keep_group=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert failed.value.code == gate.GATE_EXIT and "disk:checkpoints" in failed.value.reason
    record = records.read_gate(run_dir, AttemptId("41", 0))
    assert record is not None and record.passed is False
    (rec,) = attempt_json(run_dir)
    assert rec["preflight"] == [
        {"node": "node1", "ok": False, "reason": rec["preflight"][0]["reason"]}
    ]
    reports = records.reports_dir(run_dir, AttemptId("41", 0))
    on_disk = json.loads((reports / "node1.json").read_text())
    assert on_disk["net"]["skipped"] and on_disk["facts"]["torch"]["version"]
