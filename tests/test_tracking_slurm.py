"""tracking.wandb on the dev cluster, with W&B in offline mode: a run requeued once (pre-timeout
signal, save, requeue) writes one W&B run, whose id is the ddlaunch run id, from both attempts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.devcluster import wait_for
from support.slurm_runs import submit, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def test_a_requeued_run_is_one_wandb_run(slurm_cluster, slurm_job_cleanup, tmp_path: Path) -> None:
    pytest.importorskip("wandb")  # the tracking extra (scripts/test-all installs it)
    config = write_config(
        tmp_path,
        "wandb",
        {
            "entrypoint": "launch_entrypoints:mlp_with_wandb",
            "snapshot": "none",
            "env": {"WANDB_SILENT": "true"},
        },
        tracking={"wandb": True},
        fault_tolerance={"checkpoint_every_steps": 20, "keep_last": 0},
        params={"steps": 120, "lr": 0.05, "batch_size": 64, "seed": 0, "step_sleep": 0.15},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: progress_step(run_dir) >= 40, 240, "step 40")
    slurm_cluster.signal_job(job_id, "USR2")
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    runs = json.loads((run_dir / "attempts.json").read_text())
    assert [r["cause"] for r in runs] == ["signal", "completed"], runs
    ids = [json.loads((run_dir / "out" / f"wandb-{n}.json").read_text())["id"] for n in (0, 1)]
    assert ids == [run_dir.name, run_dir.name]
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    # One directory per attempt (W&B offline mode writes one per init), one run id for both:
    # `wandb sync` uploads them as the same run, resumed.
    assert len(offline) == 2
    assert {p.name.split("-", 3)[3] for p in offline} == {run_dir.name}
