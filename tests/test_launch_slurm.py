"""Launch through submitit on the real dev cluster: world, torchrun scripts, failures, ports."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import REPO, submit, write_config

pytestmark = pytest.mark.slurm


def rank_records(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "out").glob("rank-*.json"))]


@pytest.mark.lane
@pytest.mark.matrix
def test_two_nodes_two_ranks_agree(slurm_cluster, slurm_job_cleanup, tmp_path: Path) -> None:
    config = write_config(tmp_path, "t-world", {"entrypoint": "launch_entrypoints:world_info"})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=120) == "COMPLETED"
    recs = rank_records(run_dir)
    assert sorted(r["rank"] for r in recs) == [0, 1, 2, 3]
    assert {r["world_size"] for r in recs} == {4}
    assert len({(r["host"], r["local_rank"]) for r in recs}) == 4
    assert {r["host"] for r in recs} == set(
        slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))
    )
    assert all(r["rank_sum"] == 6.0 for r in recs)  # 0+1+2+3, exact
    assert len({r["master"] for r in recs}) == 1
    # Slurm gave the fake GPUs; every task sees the node's two.
    assert {r["cuda_visible"] for r in recs} == {"0,1"}
    # The run directory holds what submit promised.
    for name in ("config.yaml", "job.sbatch", "intent.json", "submission.json"):
        assert (run_dir / name).is_file(), name
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert json.loads((run_dir / "submission.json").read_text())["job_ids"] == [job_id]
    assert json.loads((run_dir / "intent.json").read_text())["state"] == "submitted"


def test_unmodified_torchrun_script(slurm_cluster, slurm_job_cleanup, tmp_path: Path) -> None:
    out = tmp_path / "script-out"
    script = REPO / "ddlaunch" / "examples" / "torchrun_script.py"
    config = write_config(
        tmp_path, "t-script", {"script": str(script), "args": ["--value", "2.5", "--out", str(out)]}
    )
    job_id, _ = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=120) == "COMPLETED"
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert len(recs) == 4
    assert {r["rank_sum"] for r in recs} == {6.0}
    assert {r["value_sum"] for r in recs} == {2.5 * (1 + 2 + 3 + 4)}


@pytest.mark.lane
@pytest.mark.matrix
def test_failing_rank_is_named_by_status_and_logs(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        "t-fail",
        {"entrypoint": "launch_entrypoints:fail_on_rank_1"},
        job={"requeue": False},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "FAILED", timeout=120) == "FAILED"
    first = slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))[0]
    status = ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)[0]
    assert row["state"] == "FAILED"
    assert row["failure"].startswith(f"rank 1 on {first}: ValueError: boom on rank 1 at ")
    assert "launch_entrypoints.py:" in row["failure"]
    logs = ddlaunch("logs", run_dir.name, cwd=tmp_path)
    assert logs.stdout.splitlines()[0].startswith(f"FAILED rank 1 on {first}: ValueError: boom")


@pytest.mark.lane
def test_two_jobs_on_the_same_nodes_do_not_collide(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "t-port", {"entrypoint": "launch_entrypoints:world_info"})
    # Each rank holds the nodes until all 8 ranks of both jobs have started (at most 60 s),
    # so the overlap does not depend on how fast the second job's ranks start on a loaded
    # machine; jobs that Slurm ran one after the other still do not overlap.
    pinned = [
        f"nodes.nodelist=[{','.join(slurm_cluster.nodes[:2])}]",
        "params.hold_s=60",
        f"params.hold_dir={tmp_path / 'held'}",
        "params.hold_ranks=8",
    ]
    runs = [submit(config, tmp_path, slurm_job_cleanup, *pinned) for _ in range(2)]
    for job_id, _ in runs:
        assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=150) == "COMPLETED"
    recs = [rank_records(run_dir) for _, run_dir in runs]
    assert all(len(r) == 4 and {x["rank_sum"] for x in r} == {6.0} for r in recs)
    masters = [{x["master"] for x in r} for r in recs]
    assert len(masters[0]) == len(masters[1]) == 1 and masters[0] != masters[1]
    # Both jobs held the same two nodes at the same time.
    first = (min(x["start"] for x in recs[0]), max(x["end"] for x in recs[0]))
    second = (min(x["start"] for x in recs[1]), max(x["end"] for x in recs[1]))
    assert first[0] < second[1] and second[0] < first[1], (first, second)


@pytest.mark.parametrize("how", ["ddlaunch cancel", "scancel"])
@pytest.mark.matrix
def test_cancel_stops_the_run_for_good(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path, how: str
) -> None:
    """Slurm sends a cancelled job the same SIGTERM as a preempted one, and would requeue
    even a cancelled job: the ranks save, but do not come back."""
    config = write_config(
        tmp_path,
        "t-cancel",
        {"entrypoint": "ddlaunch.examples.mlp:main"},
        params={"steps": 100000, "step_sleep": 0.05},
        fault_tolerance={"checkpoint_every_steps": 1000},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    progress = run_dir / "progress.json"
    deadline = time.time() + 120
    while not (progress.exists() and json.loads(progress.read_text()).get("step", 0) >= 5):
        assert time.time() < deadline, "training never reached step 5"
        time.sleep(0.5)
    if how == "scancel":
        slurm_cluster.cancel([job_id])
    else:
        proc = ddlaunch("cancel", run_dir.name, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    slurm_cluster.wait_job_state(job_id, "CANCELLED", timeout=60)
    time.sleep(8)  # a requeue issued by the job would show by now (PENDING/REQUEUED)
    assert slurm_cluster.job_state(job_id) == "CANCELLED"
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["state"] == "CANCELLED", outcome
    why = "cancelled" if how == "ddlaunch cancel" else "cancelled (scancel)"
    saved = int(outcome["reason"].removeprefix(f"{why}, saved step "))
    if how == "ddlaunch cancel":  # it waited for the save and says what was kept
        assert proc.stdout == f"{run_dir.name}: cancelled job {job_id}: {why}, saved step {saved}\n"
    # Our own stop is no failure: status and logs say how the run ended, nothing else (#20).
    assert not (run_dir / "failures").exists()
    row = json.loads(ddlaunch("status", run_dir.name, "--json", cwd=tmp_path).stdout)[0]
    assert (row["state"], row["detail"], row["failure"]) == (
        "CANCELLED",
        f"{why}, saved step {saved}",
        None,
    )
    assert row["step"] == row["checkpoint_step"] == saved
    logs = ddlaunch("logs", run_dir.name, cwd=tmp_path)
    assert "FAILED" not in logs.stdout and f"stopped after saving step {saved}" in logs.stdout
