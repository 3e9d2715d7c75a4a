"""Exact failure attribution on the real dev cluster (#18 item 2): a rank killed with SIGKILL
leaves no failure record, its peers raise collateral "connection closed" errors; the attempt
must name the killed rank, its host and the signal, and the run that completed after the
requeue is headlined COMPLETED, the killed rank only in its attempts."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.devcluster import DevCluster, wait_for
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import attempts, committed, mlp_config, submit

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


def rank_process(run_dir: Path, rank: int) -> tuple[int, str]:
    """The pid and node of one rank's process (the nodes share this machine's pids)."""
    for pid in DevCluster.rank_pids(run_dir):
        try:
            env = dict(
                item.split("=", 1)
                for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if "=" in item
            )
        except OSError:
            continue
        if env.get("SLURM_PROCID") == str(rank):
            return pid, env["SLURMD_NODENAME"]
    raise AssertionError(f"no process of rank {rank} for {run_dir}")


def test_a_killed_rank_is_named_and_the_completed_run_is_headlined_completed(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    started = time.monotonic()
    config = mlp_config(tmp_path, "attr-kill", params={"steps": 160, "step_sleep": 0.1})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 40, 180, "a committed step >= 40")
    pid, host = rank_process(run_dir, 1)
    os.kill(pid, signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    runs = attempts(run_dir)
    assert [r["cause"] for r in runs] == ["crash", "completed"], runs
    first = runs[0]
    assert first["culprit"] == f"rank 1 on {host} killed by SIGKILL", first
    assert first["causes"][0] == {
        "rank": 1,
        "host": host,
        "kind": "killed",
        "text": f"rank 1 on {host} killed by SIGKILL",
        "source": "srun",
    }
    # Its peers' errors (if any rank got to raise) are collateral, never the cause.
    assert all(c["kind"] != "raised" for c in first["causes"]), first["causes"]
    # Each start hook recorded where its attempt begins in the batch log Slurm appended to:
    # the second attempt's part holds its own start line and none of the first's reports.
    (log,) = (run_dir / "logs").glob(f"batch-{job_id}*")
    assert 0 <= first["log_offset"] < runs[1]["log_offset"], runs
    second_part = log.read_bytes()[runs[1]["log_offset"] :].decode(errors="replace")
    assert "[ddlaunch] attempt 1 on" in second_part and "Killed" not in second_part, second_part
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"), "NO_COLOR": "1"}
    status = ddlaunch("status", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert "FAILED" not in status.stdout, status.stdout
    row = lines[1].split()
    assert row[:3] == [run_dir.name, job_id, "COMPLETED"], status.stdout
    # One run: its attempts cell is the count, each attempt's line under the table says
    # how it ended and which rank caused it.
    assert row[6] == "2", status.stdout  # run, job, state, nodes, step, ckpt, attempts
    assert lines[2].startswith(f"attempt 0: job {job_id} on "), status.stdout
    ended = f"-> crash (committed {first['committed_step']}): rank 1 on {host} killed by SIGKILL"
    assert lines[2].endswith(ended), status.stdout
    shown = json.loads(ddlaunch("status", run_dir.name, "--json", cwd=tmp_path, env=env).stdout)
    assert shown[0]["failure"] is None
    print(f"attribution test took {time.monotonic() - started:.1f} s")
