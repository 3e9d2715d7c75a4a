"""``status`` against the real dev cluster: 1000 array tasks, one squeue call per poll."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fakes import RecordingRunner

pytestmark = pytest.mark.slurm
ARRAYS, TASKS = 10, 100  # MaxArraySize is 101 on the dev cluster: ten arrays of 100


def test_status_of_1000_array_tasks_is_one_squeue_call_per_poll(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.app.status_poll import collect

    root = tmp_path / "runs"
    arrays = []
    for _ in range(ARRAYS):
        job = slurm_cluster.sbatch(
            ["-H", f"--array=0-{TASKS - 1}", "-J", "ddl-status-1000"], "true\n", tmp_path / "o"
        )
        slurm_job_cleanup.append(job)
        arrays.append(job)
    for job in arrays:
        for task in range(TASKS):
            run = root / f"r-{job}-{task}"
            run.mkdir(parents=True)
            (run / "config.yaml").write_text("storage:\n  checkpoint_dir: null\n")
            (run / "submission.json").write_text(json.dumps({"job_ids": [f"{job}_{task}"]}))
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(root))
    runner = RecordingRunner()
    for poll in (1, 2):
        rows = collect((), runner)
        assert len(rows) == ARRAYS * TASKS
        assert {r.state for r in rows} == {"PENDING"}
        assert {r.reason for r in rows} == {"JobHeldUser"}
        slurm = [c for c in runner.calls if c[0] in ("squeue", "scontrol", "sacct")]
        assert [c[0] for c in slurm] == ["squeue"] * poll, slurm
    # Ended jobs the controller still keeps come from the same call (-t all).
    slurm_cluster.cancel(arrays[:1])
    rows = collect((), runner)
    assert sum(r.state == "CANCELLED" for r in rows) == TASKS
    assert [c[0] for c in runner.calls] == ["squeue"] * 3
