"""``submit --follow`` on the dev cluster: a run requeued once (pre-timeout signal, save,
requeue) is followed through both attempts, and the follower exits with the run's status."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.slurm_runs import write_config

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def test_submit_follow_covers_both_attempts_and_exits_with_the_run_status(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        "follow",
        {"entrypoint": "ddlaunch.examples.mlp:main", "snapshot": "none"},
        fault_tolerance={"checkpoint_every_steps": 20, "keep_last": 0},
        params={"steps": 120, "lr": 0.05, "batch_size": 64, "seed": 0, "step_sleep": 0.15,
                "log_every": 20},
    )  # fmt: skip
    env = {**os.environ, "NO_COLOR": "1", "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", "submit", str(config), "--follow"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if len(lines) == 1:
                job_id = lines[0].split()[3]  # "run <id>  job <jobid>"
                slurm_job_cleanup.append(job_id)
            if line.startswith("[mlp] step 40/"):
                slurm_cluster.signal_job(job_id, "USR2")
                break
        # The same file object to the end: communicate() would skip what it buffered.
        rest = proc.stdout.read()
        err = proc.stderr.read()  # type: ignore[union-attr]
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    lines += rest.splitlines()
    run_id = lines[0].split()[1]
    assert proc.returncode == 0, (lines, err)
    assert err.splitlines()[-1].startswith(f"[ddlaunch] run {run_id}: COMPLETED")
    saved = int(re.search(r"saved step (\d+) on SIGUSR2", rest).group(1))  # type: ignore[union-attr]
    wanted = [
        f"==> {tmp_path}/runs/{run_id}/logs/batch-{job_id}.out <==",
        "[ddlaunch] attempt 0 on ",
        "[ddlaunch] starting from scratch",
        "[mlp] step 40/120",
        f"[ddlaunch] saved step {saved} on SIGUSR2",
        f"resuming from step {saved}",
        f"[ddlaunch] starting from step {saved}",
        "[mlp] step 120/120",
        "[ddlaunch] COMPLETED:",
    ]
    found, at = [], 0
    for line in lines:
        if at < len(wanted) and wanted[at] in line:
            found.append(line)
            at += 1
    assert at == len(wanted), f"missing {wanted[at]!r} in order; output:\n" + "\n".join(lines)
    # The preflight's verdict is in the batch log and in rank 0's: shown once per attempt.
    attempts = [line for line in lines if line.startswith("[ddlaunch] attempt ")]
    verdicts = [line for line in lines if line.startswith("[ddlaunch] preflight: ")]
    assert len(attempts) == 2 and len(verdicts) == 2, "\n".join(lines)
