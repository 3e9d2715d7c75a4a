"""The parallelism plan on the real dev cluster: 2 nodes x 2 ranks with {dp: 2, tp: 2} (every
tp group on one node, by hostname; the losses of one plain process), a resume on {dp: 4,
tp: 1} that reshards and continues, and plans that are refused before anything is submitted."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch
from support.slurm_runs import TESTS, submit

from ddlaunch.config import load_config, to_plain
from ddlaunch.launch.local import run_local

pytestmark = pytest.mark.slurm
FIRST, TOTAL = 60, 100
TOLERANCE = 1e-4  # measured agreement ~1e-7 (reduction order); see test_example_transformer


def plan_config(tmp_path: Path, name: str, **parallel: object) -> Path:
    cfg = {
        "defaults": ["examples/fsdp-tp"],
        "job": {"name": name, "time": "00:10:00"},
        "launch": {"workdir": str(TESTS)},
        "parallel": {"dp": 2, "tp": 2, **parallel},
        "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0},
        "params": {"steps": FIRST},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def single_process_reference(tmp: Path, steps: int) -> dict:
    """The same model and data in one plain process (no FSDP, no tp), via the local runner."""
    cfg = load_config(
        "examples/fsdp-tp",
        ["nodes.count=1", "nodes.gpus_per_node=1", "parallel.dp=1", "parallel.tp=1",
         f"params.steps={steps}"],
    )  # fmt: skip
    run_dir = tmp / "reference"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    run_local(run_dir, 1, timeout_s=300)
    return json.loads((run_dir / "result.json").read_text())


def test_dp2_tp2_places_tp_on_one_node_then_resumes_on_dp4_tp1(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    reference: dict = {}
    ref = threading.Thread(
        target=lambda: reference.update(single_process_reference(tmp_path, TOTAL))
    )
    ref.start()  # while the job runs
    job_id, run_dir = submit(plan_config(tmp_path, "plan-dp2tp2"), tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first = json.loads((run_dir / "result.json").read_text())
    allocated = slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))
    hosts = {p["rank"]: p["host"] for p in first["placement"]}
    tp_groups = [[0, 1], [2, 3]]  # the plan's (rank r on node r // 2)
    assert [{hosts[r] for r in g} for g in tp_groups] == [{allocated[0]}, {allocated[1]}]
    assert {p["dp_shard"] for p in first["placement"] if p["host"] == allocated[0]} == {0}
    script = (run_dir / "job.sbatch").read_text()
    assert "# tp               2      2  inside a node" in script  # what render printed

    ref.join(300)
    assert abs(first["final_loss"] - reference["losses"][str(FIRST)]) < TOLERANCE

    proc = run_ddlaunch(
        "resume", run_dir.name, "--set", "parallel.dp=4", "--set", "parallel.tp=1",
        "--set", f"params.steps={TOTAL}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"resuming {run_dir.name} from step {FIRST}")
    new_job = next(x for x in proc.stdout.splitlines() if x.startswith("run ")).split()[3]
    slurm_job_cleanup.append(new_job)
    assert slurm_cluster.wait_job_state(new_job, "COMPLETED", timeout=300) == "COMPLETED"
    second = json.loads((run_dir / "result.json").read_text())
    assert second["start_step"] == FIRST and second["mesh"]["dp_shard"] == 4
    assert second["mesh"]["tp"] == 1
    # Resharded from 2 x 2 to 4 x 1: the state is the saved one, and training goes on along
    # the single process's path.
    assert abs(second["losses"][str(FIRST)] - first["final_loss"]) < TOLERANCE
    assert abs(second["final_loss"] - reference["final_loss"]) < TOLERANCE


INVALID = [
    (
        ["parallel.tp=3", "nodes.gpus_per_node=4"],
        "parallel.tp: 3 does not divide the 4 GPUs of a node (a tp group must sit inside one "
        "node); nearest valid: 2 or 4 (--set parallel.tp=3; plan-bad.yaml:12)",
    ),
    (
        ["parallel.tp=8", "nodes.gpus_per_node=4"],
        "parallel.tp: 8 is more than the 4 GPUs of a node (a tp group must sit inside one "
        "node); nearest valid: 4 (--set parallel.tp=8; plan-bad.yaml:12)",
    ),
    (
        ["parallel.dp=4"],
        "parallel: dp 4 x tp 2 x pp 1 x cp 1 = 8, but the job has 4 ranks (2 nodes x 2 GPUs); "
        "nearest valid: dp 2 or tp 1 (or dp: auto) (--set parallel.dp=4; plan-bad.yaml:13)",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), INVALID, ids=["tp3", "tp8", "dp-x-tp"])
def test_invalid_plans_are_refused_before_sbatch(
    slurm_cluster, tmp_path, overrides: list[str], message: str
) -> None:
    config = plan_config(tmp_path, "plan-bad")
    args = [a for o in overrides for a in ("--set", o)]
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"), "NO_COLOR": "1"}
    proc = run_ddlaunch("submit", str(config), *args, cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert proc.stderr == f"error: invalid config (1 error):\n  {message}\n"
    assert not (tmp_path / "runs").exists()  # nothing was created, nothing submitted
    queued = slurm_cluster.slurm("squeue", "-h", "-n", "plan-bad", "-o", "%i").stdout
    assert queued.strip() == ""
