"""The installed package on the real dev cluster: the wheel in a fresh venv (``support.shipped``),
its ``ddlaunch`` run from a directory that is not the checkout, the venv's ``python3`` on the
nodes (sbatch passes the activated venv's PATH on).

Every run is submitted from ``train/`` of a git work tree whose top holds a ``ddlaunch/``
package that fails every import: a rank, a hook or a supervisor that imported anything but the
installed ddlaunch would fail the run. The scenarios cover what the batch host and the ranks
run: a plain run and ``status``, a killed rank restarted in the allocation, the time-limit
signal's save and requeue, the in-process restart, replica groups (torchft from the ``ft``
extra), a sweep, a pipeline and the Python API.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml
from support.devcluster import processes, wait_for
from support.shipped import Shipped, shipped, work_tree_with_another_ddlaunch
from support.slurm_runs import attempts, committed, job_of, mlp_config

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.matrix]


@pytest.fixture(scope="module")
def built() -> Shipped:
    return shipped()


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """``train/`` of a git work tree whose top holds a poisoned ``ddlaunch/`` package."""
    return work_tree_with_another_ddlaunch(tmp_path / "tree") / "train"


def _cli(built: Shipped, here: Path, *argv: str, timeout: float = 120) -> CompletedProcess:
    """The venv's ``argv`` in ``here``, its runs under ``here/runs``, a bad-node list of its own."""
    bad = str(here / "bad-nodes.json")
    return built.run(argv, here, here / "runs", timeout, DDLAUNCH_BAD_NODES=bad)


def _config(here: Path, name: str, **kwargs: object) -> Path:
    """The example MLP (``support.slurm_runs.mlp_config``) with its ranks started in ``here``."""
    path = mlp_config(here, name, **kwargs)  # type: ignore[arg-type]
    cfg = yaml.safe_load(path.read_text())
    cfg["launch"]["workdir"] = str(here)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _submit(built: Shipped, here: Path, config: Path, cleanup: list[str]) -> tuple[str, Path]:
    proc = _cli(built, here, "ddlaunch", "submit", config.name)
    assert proc.returncode == 0, proc.stderr
    run_id, job_id = job_of(proc.stdout)
    cleanup.append(job_id)
    assert (
        "note: the snapshot leaves out ddlaunch/: the ranks import the ddlaunch that submits "
        f"({built.package})"
    ) in proc.stderr.splitlines(), proc.stderr
    return job_id, here / "runs" / run_id


def _rank_pid(run_dir: Path, entry: str) -> int:
    """A rank process of the run (not its srun) whose environment holds ``entry``: its rank
    (``SLURM_PROCID=N``), or its replica group (``DDLAUNCH_GROUP_RANK_OFFSET=N``)."""
    wanted = entry.encode()
    for pid, argv, environ in processes(f"DDLAUNCH_RUN_DIR={run_dir}"):
        if b"python" in argv[0] and b"ddlaunch.worker.task" in argv and wanted in environ:
            return pid
    raise AssertionError(f"no rank process with {entry} for {run_dir}")


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def test_a_run_trains_on_the_installed_package_and_status_follows_it(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(here, "shipped-plain", params={"steps": 60})
    job_id, run_dir = _submit(built, here, config, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=240) == "COMPLETED"
    assert _result(run_dir)["steps"] == 60 and _result(run_dir)["world_size"] == 4
    status = _cli(built, here, "ddlaunch", "status", run_dir.name, "--json")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)
    assert (row["run_id"], row["state"]) == (run_dir.name, "COMPLETED"), status.stdout


def test_a_killed_rank_restarts_in_the_allocation(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(here, "shipped-crash", params={"steps": 120, "step_sleep": 0.1})
    job_id, run_dir = _submit(built, here, config, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 40, 240, "a committed step >= 40")
    os.kill(_rank_pid(run_dir, "SLURM_PROCID=1"), signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first, second = _attempts(run_dir, 2)
    assert (first["cause"], second["cause"]) == ("crash", "completed"), (first, second)
    assert first["decision"].startswith("restart in the allocation"), first
    assert _result(run_dir)["start_step"] == first["committed_step"] >= 40
    # The verbs that read a finished run, as installed (report's one queue query included).
    report = _cli(built, here, "ddlaunch", "report", run_dir.name)
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report" / "report.png").stat().st_size > 0
    assert "<img" in (run_dir / "report" / "report.html").read_text()
    advise = _cli(built, here, "ddlaunch", "advise", run_dir.name)
    assert advise.returncode == 0, advise.stderr
    assert "mean of 1 restart" in advise.stdout, advise.stdout
    nodes = _cli(
        built, here, "ddlaunch", "nodes", "add", slurm_cluster.nodes[0], "--reason", "matrix"
    )
    assert nodes.returncode == 0, nodes.stderr
    listed = _cli(built, here, "ddlaunch", "nodes", "list")
    assert listed.returncode == 0 and slurm_cluster.nodes[0] in listed.stdout, listed.stdout


def test_the_time_limit_signal_saves_and_requeues(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(here, "shipped-requeue", params={"steps": 120, "step_sleep": 0.1})
    job_id, run_dir = _submit(built, here, config, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 240, "a committed step >= 20")
    slurm_cluster.signal_job(job_id, "USR2")
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first, second = _attempts(run_dir, 2)
    assert (first["cause"], second["cause"]) == ("signal", "completed"), (first, second)
    # The save on the signal is the step the second attempt resumed from.
    assert _result(run_dir)["start_step"] == first["committed_step"] > 20


def test_a_killed_rank_is_restarted_in_process(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(
        here,
        "shipped-inprocess",
        params={"steps": 120, "step_sleep": 0.1},
        fault_tolerance={"restart": "in_process", "checkpoint_every_steps": 20, "keep_last": 0},
    )
    job_id, run_dir = _submit(built, here, config, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 40, 240, "a committed step >= 40")
    survivors = [_rank_pid(run_dir, f"SLURM_PROCID={r}") for r in (0, 1, 2)]
    os.kill(_rank_pid(run_dir, "SLURM_PROCID=3"), signal.SIGKILL)
    wait_for(
        lambda: (attempts(run_dir)[-1].get("in_process_restarts") or [{}])[-1].get("state_from"),
        120,
        "the in-process restart's record",
    )
    for pid in survivors:  # training again in the same processes
        assert b"ddlaunch.worker.task" in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    (only,) = _attempts(run_dir, 1)  # no process restart, no requeue
    (restart,) = only["in_process_restarts"]
    assert restart["ranks"] == [3], restart
    assert _result(run_dir)["steps"] == 120


def test_replica_groups_restart_only_the_killed_group(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(
        here,
        "shipped-groups",
        params={"steps": 150, "step_sleep": 0.1},
        parallel={"dp_replicate": 2},
        fault_tolerance={"mode": "replica_groups"},
        health={"preflight": False, "heartbeat_interval": 1.0},
    )
    job_id, run_dir = _submit(built, here, config, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 240, "a committed step >= 20")
    os.kill(_rank_pid(run_dir, "DDLAUNCH_GROUP_RANK_OFFSET=2"), signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=360) == "COMPLETED"
    (only,) = _attempts(run_dir, 1)  # the job itself never restarted
    restarts = only.get("group_restarts") or []
    assert [r["group"] for r in restarts] == [1], restarts
    assert _result(run_dir)["steps"] == 150


def test_a_sweep_and_a_pipeline_run_to_their_end(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    base = _config(here, "shipped-base", params={"steps": 30})
    grid = {"base": base.name, "grid": {"params.lr": [0.05, 0.1]}}
    (here / "lr.yaml").write_text(yaml.safe_dump(grid))
    sweep = _cli(built, here, "ddlaunch", "sweep", "lr.yaml")
    assert sweep.returncode == 0, sweep.stderr
    sweep_dir = Path(sweep.stdout.splitlines()[1].split(": ", 1)[1])
    stages = {"train": {"config": base.name}, "again": {"config": base.name, "after": "train"}}
    (here / "chain.yaml").write_text(yaml.safe_dump({"name": "shipped-pl", "stages": stages}))
    pipeline = _cli(built, here, "ddlaunch", "pipeline", "chain.yaml")
    assert pipeline.returncode == 0, pipeline.stderr
    stage_jobs = [line.split()[5] for line in pipeline.stdout.splitlines()[2:]]
    assert len(stage_jobs) == 2, pipeline.stdout
    slurm_job_cleanup.extend(stage_jobs)
    for job in stage_jobs:
        assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=360) == "COMPLETED"

    def members() -> list[dict]:
        said = _cli(built, here, "ddlaunch", "sweep", "status", str(sweep_dir), "--json")
        assert said.returncode == 0, said.stderr
        rows = json.loads(said.stdout)["members"]
        return rows if all(m["state"] == "COMPLETED" for m in rows) else []

    rows = wait_for(members, 360, "every member COMPLETED", poll=3.0)
    assert len(rows) == 2, rows


PYTHON_API = """
import json, sys
import ddlaunch
run = ddlaunch.submit(sys.argv[1])
status = run.wait(timeout=300)
print(json.dumps({"module": ddlaunch.__file__, "state": status.state, "result": run.result}))
"""


def test_the_python_api_submits_and_waits(
    built: Shipped, here: Path, slurm_cluster, slurm_job_cleanup
) -> None:
    config = _config(here, "shipped-api", params={"steps": 30})
    proc = _cli(built, here, "python", "-c", PYTHON_API, config.name, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    assert said["module"].startswith(str(built.venv)), said
    assert said["state"] == "COMPLETED" and said["result"]["steps"] == 30, said


def _attempts(run_dir: Path, count: int) -> list[dict]:
    """The run's attempt records, which must be ``count``: an extra one (a requeue the test
    did not cause) fails with all of them shown, not as an unpacking error."""
    runs = attempts(run_dir)
    assert len(runs) == count, runs
    return runs
