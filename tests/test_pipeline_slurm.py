"""``ddlaunch pipeline FILE`` on the dev cluster: train, then eval and export after it. The
training stage is cancelled while it trains (its dependents stay pending), ``ddlaunch
resume`` of it moves both onto its new job, and both run only once the resumed training
completed, each reading its run directory from ``DDLAUNCH_AFTER_TRAIN_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for
from support.slurm_runs import attempts, eval_config, mlp_config

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def test_a_pipeline_survives_the_resume_of_its_first_stage(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    train = mlp_config(tmp_path, "pl-train", params={"steps": 100, "step_sleep": 0.2})
    stages = {
        "train": {"config": str(train)},
        "eval": {"config": str(eval_config(tmp_path)), "after": "train"},
        "export": {"config": str(eval_config(tmp_path)), "after": ["train:ok"]},
    }
    (tmp_path / "chain.yaml").write_text(yaml.safe_dump({"name": "pl", "stages": stages}))
    proc = ddlaunch("pipeline", "chain.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pipeline_id = lines[0].split()[1].rstrip(":")
    submitted = {w[1]: (tmp_path / "runs" / w[3], w[5]) for w in map(str.split, lines[2:])}
    assert list(submitted) == ["train", "eval", "export"], proc.stdout
    slurm_job_cleanup.extend(job for _, job in submitted.values())
    (train_dir, train_job), (eval_dir, eval_job), (export_dir, export_job) = submitted.values()
    for job in (eval_job, export_job):
        assert slurm_cluster.job_field(job, "Dependency") == f"afterok:{train_job}(unfulfilled)"

    assert slurm_cluster.wait_job_state(train_job, "RUNNING", timeout=120) == "RUNNING"
    proc = ddlaunch("cancel", train_dir.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    wait_for(
        lambda: slurm_cluster.job_field(eval_job, "Reason") == "DependencyNeverSatisfied",
        timeout=60,
        what="the dependents' dependency to fail",
    )
    status = " ".join(ddlaunch("status", cwd=tmp_path).stdout.split())
    assert (
        f"pipeline of 3: train CANCELLED, eval PENDING, export PENDING "
        f"(ddlaunch status {pipeline_id})"
    ) in status, status

    proc = ddlaunch("resume", train_dir.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new_job = next(x for x in proc.stdout.splitlines() if x.startswith("run ")).split()[3]
    slurm_job_cleanup.append(new_job)
    moved = {line for line in proc.stdout.splitlines() if line.startswith("moved ")}
    assert moved == {
        f"moved the dependency of {eval_dir.name} (job {eval_job}) onto job {new_job}",
        f"moved the dependency of {export_dir.name} (job {export_job}) onto job {new_job}",
    }
    assert slurm_cluster.wait_job_state(new_job, "COMPLETED", timeout=300) == "COMPLETED"
    for job in (eval_job, export_job):
        assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=180) == "COMPLETED"
    train_end = attempts(train_dir)[-1]["end"]
    assert (train_dir / "checkpoints" / "step-100").is_dir()  # its final checkpoint
    for dependent in (eval_dir, export_dir):
        record = json.loads((dependent / "out" / "after-0.json").read_text())
        assert record["start"] > train_end, (dependent.name, record["start"], train_end)
        assert record["after"] == {"DDLAUNCH_AFTER_TRAIN_DIR": str(train_dir)}
        assert record["results"] == {"DDLAUNCH_AFTER_TRAIN_DIR": True}
    status = " ".join(ddlaunch("status", cwd=tmp_path).stdout.split())
    assert (
        f"pipeline of 3: train COMPLETED, eval COMPLETED, export COMPLETED "
        f"(ddlaunch status {pipeline_id})"
    ) in status, status
