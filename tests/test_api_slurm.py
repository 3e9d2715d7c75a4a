"""The Python API on the real dev cluster: ``ddlaunch.submit`` of the mlp example, ``wait``
to COMPLETED and its ``result``, a second process re-attaching by an id prefix and reading
the same state, the rank's lines from ``logs``, and ``cancel`` of a running job ending it
CANCELLED. One node per job, so that it runs beside other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.devcluster import wait_for

import ddlaunch

pytestmark = pytest.mark.slurm

ONE_NODE = ["nodes.count=1"]  # 1 node x 2 ranks


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own run root; polls every second (the floor ``wait`` keeps)."""
    root = tmp_path / "runs"
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(root))
    monkeypatch.setenv("DDLAUNCH_MIN_POLL_S", "1")
    return root


REATTACH = """
import json, sys
import ddlaunch
run = ddlaunch.Run(sys.argv[1])
s = run.status()
print(json.dumps([str(run.dir), s.state, s.step, s.checkpoint, s.attempts, s.job_id, run.result]))
"""


def test_submit_wait_reattach_and_logs(slurm_cluster, slurm_job_cleanup, run_root: Path) -> None:
    steps = ["params.steps=60", "params.log_every=20", "job.name=api-wait"]
    run = ddlaunch.submit("examples/mlp", [*ONE_NODE, *steps])
    assert run.job_id is not None
    slurm_job_cleanup.append(run.job_id)
    assert run.dir.parent == run_root
    final = run.wait(timeout=300, poll=1)
    assert (final.state, final.step, final.attempts) == ("COMPLETED", 60, 1), final
    assert final.history[0].cause == "completed"
    result = run.result
    assert result is not None
    assert (result["steps"], result["world_size"]) == (60, 2)
    # Another process knows the run by an id prefix and reads the same state.
    proc = subprocess.run(
        [sys.executable, "-c", REATTACH, run.id[:-3]],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    seen = json.loads(proc.stdout)
    assert seen == [
        str(run.dir), "COMPLETED", 60, final.checkpoint, 1, run.job_id, result
    ]  # fmt: skip
    lines = [line for line in run.logs(rank=0) if line.startswith("[mlp] ")]
    assert [line.split(" loss ")[0] for line in lines] == [
        "[mlp] step 20/60",
        "[mlp] step 40/60",
        "[mlp] step 60/60",
    ]
    # Following an ended run yields the same lines and stops.
    followed = [line for line in run.logs(rank=0, follow=True) if line.startswith("[mlp] ")]
    assert followed == lines


def test_cancel_ends_a_running_job_cancelled(
    slurm_cluster, slurm_job_cleanup, run_root: Path
) -> None:
    slow = ["params.steps=5000", "params.step_sleep=0.05", "job.name=api-cancel"]
    run = ddlaunch.submit("examples/mlp", [*ONE_NODE, *slow])
    assert run.job_id is not None
    slurm_job_cleanup.append(run.job_id)
    wait_for(lambda: (run.status().step or 0) >= 20, 240, "step 20", poll=1.0)
    after = run.cancel(wait=120)
    assert after.state == "CANCELLED", after
    assert slurm_cluster.job_state(run.job_id) in (None, "CANCELLED")
    assert run.wait(timeout=30, poll=1).state == "CANCELLED"
    assert run.result is None  # the training never reached its end


def test_a_sweep_from_python_runs_its_members_to_their_end(
    slurm_cluster, slurm_job_cleanup, run_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "base.yaml").write_text(
        "defaults: [examples/mlp]\njob: {name: api-sweep, time: '00:05:00'}\n"
        "nodes: {count: 1, gpus_per_node: 1, cpus_per_task: 1}\nparams: {steps: 20}\n"
    )
    (tmp_path / "sweep.yaml").write_text("base: base.yaml\ngrid:\n  params.lr: [0.01, 0.02]\n")
    sweep = ddlaunch.sweep(tmp_path / "sweep.yaml")
    assert [(a.members, a.error) for a in sweep.arrays] == [((0, 1), None)]
    slurm_job_cleanup.extend(a.job_id for a in sweep.arrays if a.job_id)
    assert sweep.dir.parent == run_root
    again = ddlaunch.Sweep(sweep.id)  # re-attached by its id, as another process would
    status = wait_for(lambda: (s := again.status()).ended and s, timeout=240, what="the sweep")
    assert [m.state for m in status.members] == ["COMPLETED", "COMPLETED"], status
    assert [m.overrides for m in status.members] == ["params.lr=0.01", "params.lr=0.02"]
    assert all(isinstance(m.metric, float) for m in status.members)  # final_loss, reported
    assert again.member(1).result is not None
    assert again.resubmit(failed=True).arrays == ()  # nothing failed: nothing submitted
