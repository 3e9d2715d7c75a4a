"""``submit --after`` on the dev cluster: a training run A, an evaluation B submitted
``--after A``; A is cancelled while it runs (B stays pending, its dependency never
satisfied), ``ddlaunch resume A`` moves B onto A's new job, and B runs only once the resumed
A completed, reading A's run directory from ``DDLAUNCH_AFTER_<NAME>_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for
from support.slurm_runs import attempts, eval_config, mlp_config, submit

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.mark.matrix
def test_resume_moves_the_dependent_which_runs_after_the_resumed_run(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    # A: slow enough to be cancelled while it trains, short once resumed.
    train = mlp_config(tmp_path, "af-train", params={"steps": 100, "step_sleep": 0.2})
    train_job, train_dir = submit(train, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(train_job, "RUNNING", timeout=120) == "RUNNING"

    proc = ddlaunch("submit", str(eval_config(tmp_path)), "--after", train_dir.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0].split()  # "run <id>  job <jobid>"
    eval_dir, eval_job = tmp_path / "runs" / first[1], first[3]
    slurm_job_cleanup.append(eval_job)
    assert slurm_cluster.job_field(eval_job, "Dependency") == f"afterok:{train_job}(unfulfilled)"

    slurm_cluster.cancel([train_job])
    assert slurm_cluster.wait_job_state(train_job, "CANCELLED", timeout=120) == "CANCELLED"
    # afterok on a cancelled job: B waits for ever (never cancelled: no kill_invalid_depend).
    wait_for(
        lambda: slurm_cluster.job_field(eval_job, "Reason") == "DependencyNeverSatisfied",
        timeout=60,
        what="B's dependency to fail",
    )
    assert slurm_cluster.job_state(eval_job) == "PENDING"
    status = ddlaunch("status", eval_dir.name, cwd=tmp_path)
    assert (
        f"{train_dir.name} ended CANCELLED: resume it (ddlaunch resume {train_dir.name}) or "
        "cancel this run"
    ) in " ".join(status.stdout.split())

    proc = ddlaunch("resume", train_dir.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new_job = next(x for x in proc.stdout.splitlines() if x.startswith("run ")).split()[3]
    slurm_job_cleanup.append(new_job)
    assert proc.stdout.splitlines()[-1] == (
        f"moved the dependency of {eval_dir.name} (job {eval_job}) onto job {new_job}"
    )
    assert slurm_cluster.job_field(eval_job, "Dependency") == f"afterok:{new_job}(unfulfilled)"

    assert slurm_cluster.wait_job_state(new_job, "COMPLETED", timeout=300) == "COMPLETED"
    assert slurm_cluster.wait_job_state(eval_job, "COMPLETED", timeout=180) == "COMPLETED"
    # B started only after the resumed A ended: its rank's start is after A's last
    # attempt closed (the end hook, before Slurm counts the job completed).
    train_end = attempts(train_dir)[-1]["end"]
    record = json.loads((eval_dir / "out" / "after-0.json").read_text())
    assert record["start"] > train_end, (record["start"], train_end)
    assert attempts(eval_dir)[0]["start"] > train_end
    # B read A's run directory, and A's result was there.
    assert record["after"] == {"DDLAUNCH_AFTER_AF_TRAIN_DIR": str(train_dir)}
    assert record["results"] == {"DDLAUNCH_AFTER_AF_TRAIN_DIR": True}
    assert json.loads((train_dir / "submission.json").read_text())["job_ids"] == [
        train_job,
        new_job,
    ]
