"""Verbs that tell the truth, on the real dev cluster (#20): a cancel before the first step is
concluded by ``cancel`` once the job is gone, a sweep is cancelled as a whole without creating
the directories of members that never started, and every state read afterwards says
CANCELLED (``status``, ``sweep status``), never UNKNOWN or FAILED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for
from support.slurm_runs import TESTS, submit

pytestmark = pytest.mark.slurm


def one_node_config(tmp_path: Path, name: str, **params: object) -> Path:
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:05:00"},
        "nodes": {"count": 1, "gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "launch_entrypoints:slow_start",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
        "fault_tolerance": {"checkpoint_every_steps": 5},
        "health": {"preflight": False},
        "params": {"steps": 1000, "step_sleep": 0.2, "start_sleep": 0, **params},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_cancel_before_the_first_step_is_concluded(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    config = one_node_config(tmp_path, "t-early", start_sleep=600)
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    # The start hook opened the attempt and the rank is in its start-up: no step will come.
    wait_for(lambda: (run_dir / "out" / "started-0.json").exists(), 120, "the rank's start")
    wait_for(lambda: (run_dir / "attempts.json").exists(), 60, "the attempt record")
    proc = ddlaunch("cancel", run_dir.name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        f"{run_dir.name}: cancelled job {job_id}: cancelled before any checkpoint\n"
    )
    assert proc.stderr == f"waiting for job {job_id} to stop (the ranks save first)...\n"
    (attempt,) = json.loads((run_dir / "attempts.json").read_text())
    assert attempt["cause"] == "cancelled" and "end" in attempt
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["state"], outcome["reason"]) == ("CANCELLED", "cancelled before any checkpoint")
    row = json.loads(ddlaunch("status", run_dir.name, "--json", cwd=tmp_path).stdout)[0]
    assert (row["state"], row["detail"], row["failure"]) == (
        "CANCELLED",
        "cancelled before any checkpoint",
        None,
    )
    assert [a["cause"] for a in row["history"]] == ["cancelled"]
    # A second cancel changes nothing and says so.
    again = ddlaunch("cancel", run_dir.name, cwd=tmp_path)
    assert again.stdout == f"{run_dir.name}: already cancelled; nothing to do\n"
    logs = ddlaunch("logs", run_dir.name, cwd=tmp_path)
    assert "FAILED" not in logs.stdout


def test_a_sweep_is_cancelled_as_a_whole(slurm_cluster, tmp_path: Path) -> None:
    base = yaml.safe_load(one_node_config(tmp_path, "t-sweep-cancel").read_text())
    base["launch"]["entrypoint"] = "ddlaunch.examples.mlp:main"
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = {"base": "base.yaml", "grid": {"params.lr": [0.01, 0.02, 0.03]}, "throttle": 1}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    proc = ddlaunch("sweep", "sweep.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep_dir = Path(proc.stdout.splitlines()[1].split(": ", 1)[1])
    sweep_id = sweep_dir.name
    members = sweep_dir / "members"
    array = json.loads((sweep_dir / "arrays" / "0.json").read_text())["job_id"]
    try:
        # throttle 1: member 0 trains, 1 and 2 wait.
        wait_for(
            lambda: (
                json.loads((members / "0" / "progress.json").read_text())["step"] >= 3
                if (members / "0" / "progress.json").exists()
                else None
            ),
            180,
            "member 0's training",
        )
        one = ddlaunch("cancel", f"{sweep_id}/2", cwd=tmp_path)
        assert one.stdout == f"{sweep_id}/2: cancelled job {array}_2 before it started\n"
        assert not (members / "2").exists()  # no directory for a member that never ran
        whole = ddlaunch("cancel", sweep_id, cwd=tmp_path)
        assert whole.returncode == 0, whole.stderr
        assert whole.stdout == (
            f"{sweep_id}: cancelled 2 members (1 pending, 1 running; array {array}); "
            "1 had ended already\n"
        )
        assert sorted(p.name for p in members.iterdir() if not p.name.startswith(".")) == ["0"]
        saved = json.loads((members / "0" / "outcome.json").read_text())
        assert saved["state"] == "CANCELLED" and saved["reason"].startswith(
            "cancelled, saved step "
        )
        states = json.loads(ddlaunch("sweep", "status", sweep_id, "--json", cwd=tmp_path).stdout)
        assert [m["state"] for m in states["members"]] == ["CANCELLED"] * 3
        assert states["summary"] == "3 members: 3 CANCELLED"
        rows = json.loads(ddlaunch("status", sweep_id, "--json", cwd=tmp_path).stdout)
        assert [(r["run_id"], r["state"]) for r in rows] == [
            (f"{sweep_id}/{i}", "CANCELLED") for i in range(3)
        ]
        picked = ddlaunch("sweep", "resubmit", sweep_id, "--cancelled", "--dry-run", cwd=tmp_path)
        assert picked.stdout.startswith(f"# resubmitting 3 members of {sweep_id}: 0, 1, 2\n")
        assert not (members / "1").exists()  # a dry run creates nothing either
    finally:
        slurm_cluster.cancel([array])
