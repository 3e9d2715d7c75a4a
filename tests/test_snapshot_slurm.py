"""Code snapshots on the dev cluster: a job submitted from a git work tree runs the code as
submitted, though the training module is edited before the job starts and again before its
requeue."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch, wait_for
from support.git_repos import GIT, git_repo

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

TRAIN = """
import os
from pathlib import Path

VERSION = "{version}"


def main(config):
    from ddlaunch.examples.mlp import main as mlp

    out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
    out.mkdir(exist_ok=True)
    name = f"version-{{os.environ.get('SLURM_RESTART_COUNT', '0')}}-{{os.environ['RANK']}}.txt"
    (out / name).write_text(f"{{VERSION}} {{__file__}}")
    return mlp(config)
"""


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def test_the_job_runs_the_submitted_code_after_edits_and_a_requeue(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path / "repo")
    train = repo / "snap_train.py"
    train.write_text(TRAIN.format(version="v1"))
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "v1"], check=True)
    (repo / "job.yaml").write_text(
        yaml.safe_dump(
            {
                "defaults": ["examples/mlp"],
                "job": {"name": "snap"},
                "launch": {"entrypoint": "snap_train:main"},
                "sbatch": {"hold": True},  # it starts only once the code was edited
                "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0},
                "params": {"steps": 120, "step_sleep": 0.15},
            }
        )
    )
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(repo / "runs"),  # inside the work tree, untracked
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad-nodes.json"),
    }
    proc = run_ddlaunch("submit", "job.yaml", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr
    run_id, job_id = proc.stdout.split()[1], proc.stdout.split()[3]
    slurm_job_cleanup.append(job_id)
    run_dir = repo / "runs" / run_id
    snap = json.loads((run_dir / "snapshot.json").read_text())
    assert proc.stderr.startswith(f"code: git snapshot {snap['id']} of {repo} (stored, ")
    train.write_text(TRAIN.format(version="v2"))  # edited while the job waits
    slurm_cluster.slurm("scontrol", "release", job_id)
    wait_for(lambda: progress_step(run_dir) >= 40, 240, "step 40")
    train.write_text(TRAIN.format(version="v3"))  # edited again before the requeue
    slurm_cluster.signal_job(job_id, "USR2")
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    runs = json.loads((run_dir / "attempts.json").read_text())
    assert [r["cause"] for r in runs] == ["signal", "completed"], runs
    seen = {p.name: p.read_text() for p in sorted((run_dir / "out").glob("version-*.txt"))}
    module = f"{snap['path']}/snap_train.py"
    assert seen == {f"version-{a}-{r}.txt": f"v1 {module}" for a in (0, 1) for r in range(4)}
