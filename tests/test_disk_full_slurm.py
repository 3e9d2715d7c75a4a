"""A checkpoint directory that fills up during training, on the real dev cluster: a small
tmpfs mounted as ``storage.checkpoint_dir`` (the nodes share this machine's mounts), filled
once a checkpoint has committed. The next save fails on every rank together, is never
committed, the previous checkpoint stays complete, and the run stops with the reason in
``status``; no rank is left hanging."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for
from support.slurm_runs import attempts, mlp_config, submit

from ddlaunch.checkpoint.layout import latest_complete, list_checkpoints
from ddlaunch.store.failures import rank_records

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    mount = tmp_path / "ckpt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> None:
    """Every last byte: smaller and smaller writes until even one byte does not fit."""
    with open(mount / "filler", "wb", buffering=0) as handle:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    handle.write(b"\0" * size)
            except OSError:
                pass


def test_full_checkpoint_disk_stops_the_run_with_the_reason(
    slurm_cluster, slurm_job_cleanup, tmp_path, small_disk
) -> None:
    config = mlp_config(
        tmp_path,
        "ft-full",
        params={"steps": 100000, "step_sleep": 0.05},
        fault_tolerance={"checkpoint_every_steps": 10},
        storage={"checkpoint_dir": str(small_disk)},
        health={"min_free_gb": 0},  # the preflight would refuse a 4 MB disk up front
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: (latest_complete(small_disk) or _none()).step >= 20, 180, "step 20 committed")
    fill(small_disk)
    filled_at = time.monotonic()
    kept = latest_complete(small_disk)
    assert kept is not None
    assert slurm_cluster.wait_job_state(job_id, "FAILED", timeout=120) == "FAILED"
    print(f"full disk -> job ended in {time.monotonic() - filled_at:.1f} s")
    reason = f"checkpoint save failed: no space left on {small_disk}"
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome == {**outcome, "state": "FAILED", "reason": reason}
    status = ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    row = json.loads(status.stdout)[0]
    assert row["state"] == "FAILED" and row["detail"] == reason, row
    # Never committed, the previous checkpoint kept, and every rank failed alike.
    infos = list_checkpoints(small_disk)
    assert latest_complete(small_disk) == kept
    assert [i.step for i in infos if i.complete][-1] == kept.step
    assert all(not i.complete for i in infos if i.step > kept.step)
    records = [r for _, r in rank_records(run_dir).values()]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    assert {r["exception"] for r in records} == {"CheckpointSaveError"}
    assert all(r["message"].startswith(reason) for r in records), records
    (only,) = attempts(run_dir)
    assert only["cause"] == "checkpoint save failed" and only["decision"] == reason


class _none:
    step = -1
