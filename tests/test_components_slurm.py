"""Heterogeneous jobs (``components:``) on the real dev cluster, whose first node has
``gpu:fast`` and the others ``gpu:slow`` (scripts/devcluster DDL_DEVCLUSTER_GPU_TYPES): one
training world over unlike nodes, and a service beside the ranks that restarts alone."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import processes
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import TESTS, attempts, committed, result, submit

pytestmark = pytest.mark.slurm

STEPS = 60
RANK_LINE = re.compile(r"\[ddlaunch\] rank (\d+)/(\d+) local \d+ host (\S+)")


def _config(tmp_path: Path, name: str, components: list[dict] | None, **params: object) -> Path:
    cfg: dict = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 1, "cpus_per_task": 1},
        "launch": {"workdir": str(TESTS), "backend": "gloo"},
        "health": {"preflight": False},
        "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0},
        "params": {"steps": STEPS, "lr": 0.05, "batch_size": 64, "seed": 0, **params},
    }
    cfg["launch"]["entrypoint"] = str(params.pop("entrypoint", "ddlaunch.examples.mlp:main"))
    cfg["params"].pop("entrypoint", None)
    if components is not None:
        cfg["components"] = components
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train_and_server(port: int) -> list[dict]:
    """A train component of one node and a service of one node: the pid server on ``port``."""
    command = ["python3", "-u", "trainer_scripts/pid_server.py", "--port", port]
    return [
        {"name": "train", "nodes": {"count": 1}},
        {
            "name": "server",
            "role": "service",
            "nodes": {"count": 1, "gpus_per_node": 0},
            "launch": {"command": command},
        },
    ]


def _features(env: dict[str, str]) -> dict[str, str]:
    """Each node's features (its GPU type on the dev cluster)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %f"], env=env, capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _rank_hosts(run_dir: Path) -> dict[int, str]:
    hosts = {}
    for path in (run_dir / "logs").glob("rank-*.out"):
        for rank, _, host in RANK_LINE.findall(path.read_text()):
            hosts[int(rank)] = host
    return hosts


@pytest.mark.matrix
def test_train_components_are_one_world_over_unlike_nodes(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    het = _config(
        tmp_path,
        "t-het",
        [
            {"name": "fast", "nodes": {"count": 1, "gpu_type": "fast"}},
            {"name": "slow", "nodes": {"count": 1, "gpu_type": "slow"}},
        ],
        step_sleep=0.05,
    )
    plain = _config(tmp_path, "t-het-ref", None)
    het_job, het_dir = submit(het, tmp_path, slurm_job_cleanup)
    ref_job, ref_dir = submit(plain, tmp_path, slurm_job_cleanup)
    # A failure in one component restarts the world: the slow component's rank is killed
    # once step 20 is committed.
    _wait_for(lambda: committed(het_dir) >= 20, timeout=180)
    [victim] = [
        pid
        for pid, _, environ in processes(f"DDLAUNCH_RUN_DIR={het_dir}")
        if b"SLURM_PROCID=1" in environ and pid in slurm_cluster.rank_pids(het_dir)
    ]
    os.kill(victim, signal.SIGKILL)
    for job in (het_job, ref_job):
        assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=240) == "COMPLETED"
    # Rank 0 on the fast node, rank 1 on a slow one: one world of two ranks, numbered
    # component by component.
    features = _features(slurm_cluster.env)
    hosts = _rank_hosts(het_dir)
    assert sorted(hosts) == [0, 1]
    assert features[hosts[0]] == "fast" and features[hosts[1]] == "slow"
    script = (het_dir / "job.sbatch").read_text()
    assert "#SBATCH hetjob" in script and "--het-group=0,1" in script
    # srun numbers the tasks per component ("task 0" on the slow node): the culprit is still
    # rank 1, and both ranks restarted in the allocation from the committed step.
    first, second = attempts(het_dir)
    assert first["culprit"] == f"rank 1 on {hosts[1]} killed by SIGKILL"
    assert first["nodes"] == second["nodes"] == f"{hosts[0]},{hosts[1]}"
    assert second["resumed_from"] >= 20 and second["cause"] == "completed"
    # The same training as on two like nodes without a failure, to the bit (gloo on CPU
    # sums in a fixed order; the resume restores every state).
    assert result(het_dir)["param_sha256"] == result(ref_dir)["param_sha256"]
    assert result(het_dir)["world_size"] == 2


@pytest.mark.matrix
def test_a_service_runs_beside_the_ranks_and_restarts_alone(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    port = 18431
    config = _config(
        tmp_path,
        "t-svc",
        _train_and_server(port),
        entrypoint="launch_entrypoints:mlp_asking_a_service",
        port=port,
        steps=150,
        step_sleep=0.1,
    )
    job, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    out = run_dir / "out"
    first = _wait_for(lambda: sorted(out.glob("server-*")), timeout=120)
    answers = out / "answers.txt"
    _wait_for(lambda: answers.is_file() and len(answers.read_text().splitlines()) >= 10, 60)
    server_pid = int(first[0].name.split("-")[1])
    os.kill(server_pid, signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=240) == "COMPLETED"

    # The server came back as a new process on its node; the ranks never restarted.
    servers = sorted(int(p.name.split("-")[1]) for p in out.glob("server-*"))
    assert len(servers) == 2 and server_pid in servers
    answered = {int(line.split()[1]) for line in answers.read_text().splitlines()}
    assert answered == set(servers)
    [attempt] = attempts(run_dir)
    assert attempt["cause"] == "completed"
    assert len((out / "pid-0.txt").read_text().split()) == 1
    assert result(run_dir)["steps"] == 150
    # The trainer found the server through the environment, on the service's own node.
    server_host = first[0].read_text().split(":")[0]
    assert server_host not in attempt["nodes"].split(",")
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    # The job's end sent the server's task TERM (scancel of its step), not srun's KILL.
    assert re.fullmatch(
        r"service server: stopped at the job's end \(TERM; restarted 1 time, last exit \d+\)",
        status.stdout.splitlines()[-1],
    ), status.stdout
    batch = next((run_dir / "logs").glob("batch-*.out")).read_text()
    assert (
        "[ddlaunch] service server failed (exit 137): starting it again (restart 1 of 3); "
        "the training goes on"
    ) in batch


def _wait_for(probe, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.matrix
def test_doctor_checks_every_components_nodes(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    config = _config(
        tmp_path,
        "t-het-doctor",
        [
            {"name": "fast", "nodes": {"count": 1, "gpu_type": "fast"}},
            {"name": "slow", "nodes": {"count": 1, "gpu_type": "slow"}},
            {
                "name": "server",
                "role": "service",
                "nodes": {"count": 1, "gpus_per_node": 0},
                "launch": {"command": ["true"]},
            },
        ],
    )
    proc = ddlaunch("doctor", str(config), "--timeout", "240", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {
        line.split()[0]: line
        for line in proc.stdout.splitlines()
        if line.startswith("node") and " ok " in line
    }
    features = _features(slurm_cluster.env)
    # Three nodes, one per component, each judged by its own component's GPUs.
    assert len(rows) == 3, proc.stdout + proc.stderr
    assert sorted(features[n] for n in rows) == ["fast", "slow", "slow"]
    by_type = {features[n]: line for n, line in rows.items()}
    assert "  1 assigned by Slurm (nvidia-smi absent" in by_type["fast"]
    assert "  no GPUs requested  " in rows[sorted(rows)[-1]] or any(
        "  no GPUs requested  " in line for line in rows.values()
    )
    assert sum("  1 assigned by Slurm" in line for line in rows.values()) == 2


def test_balance_by_throughput_gives_the_slow_component_less_and_the_steps_get_faster(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    # One rank on the fast node, one on a slow one, the slow one twice as slow per sample:
    # with equal shares (16 + 16) a step waits for the slow rank (16 x 10 ms); balanced,
    # the shares go to about 21 + 11 and a step takes about 11 x 10 ms: ~1.45x (ideal 1.5x).
    steps, measure = 40, 5
    components = [
        {"name": "fast", "nodes": {"count": 1, "gpu_type": "fast"}},
        {"name": "slow", "nodes": {"count": 1, "gpu_type": "slow"}},
    ]
    runs = {}
    for mode in ("none", "by_throughput"):
        config = _config(
            tmp_path,
            f"t-bal-{mode}",
            components,
            entrypoint="launch_entrypoints:balanced_linear",
            steps=steps,
            sleep_per_sample={"fast": 0.005, "slow": 0.010},
        )
        data = yaml.safe_load(config.read_text())
        data["balance"] = {"mode": mode, "global_batch": 32, "measure_steps": measure}
        data["fault_tolerance"]["checkpoint_every_steps"] = 100
        config.write_text(yaml.safe_dump(data))
        runs[mode] = submit(config, tmp_path, slurm_job_cleanup)
    for job, _ in runs.values():
        assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=240) == "COMPLETED"

    def steps_of(run_dir: Path, rank: int) -> dict:
        return json.loads((run_dir / "out" / f"steps-{rank}.json").read_text())

    plain, balanced = runs["none"][1], runs["by_throughput"][1]
    assert steps_of(plain, 0)["shares"] == [16] * steps
    fast, slow = steps_of(balanced, 0)["shares"], steps_of(balanced, 1)["shares"]
    assert fast[:measure] == slow[:measure] == [16] * measure
    assert fast[-1] > 16 > slow[-1] and fast[-1] + slow[-1] == 32
    # Step time after the switch (the first steps after it left out), rank 0's view.
    after = slice(measure + 5, steps)
    mean = {
        mode: statistics.mean(steps_of(run_dir, 0)["step_s"][after])
        for mode, (_, run_dir) in runs.items()
    }
    assert mean["none"] / mean["by_throughput"] >= 1.3, mean
    # The same training either way: every step's gradient is the whole global batch's.
    weights = [
        json.loads((run_dir / "out" / "weights.json").read_text())["weights"]
        for _, run_dir in runs.values()
    ]
    assert weights[0] == pytest.approx(weights[1], abs=1e-12)
    status = ddlaunch("status", balanced.name, cwd=tmp_path)
    assert status.stdout.splitlines()[-1].startswith(
        f"batch shares: fast {fast[-1]}/rank x1, slow {slow[-1]}/rank x1 (by throughput: "
    ), status.stdout


def test_cancel_of_a_service_stops_it_and_the_training_completes(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    port = 18432
    config = _config(
        tmp_path,
        "t-svc-cancel",
        _train_and_server(port),
        steps=300,
        step_sleep=0.1,
    )
    job, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    out = run_dir / "out"
    (first,) = _wait_for(lambda: sorted(out.glob("server-*")), timeout=120)
    server_pid = int(first.name.split("-")[1])
    asked = ddlaunch("cancel", run_dir.name, "--component", "server", cwd=tmp_path)
    assert (asked.returncode, asked.stderr) == (0, ""), asked.stderr
    assert asked.stdout == (
        f"{run_dir.name}: asked the supervisor of service server in job {job} to stop it; it "
        "looks every 1 s, ends the service's step and records it stopped, without starting it "
        f"again; the training goes on (`ddlaunch status {run_dir.name}` says when)\n"
    )
    record = run_dir / "components" / "server.json"
    _wait_for(lambda: '"state": "stopped"' in record.read_text(), timeout=30)
    _wait_for(lambda: not Path(f"/proc/{server_pid}").exists(), timeout=30)
    # The ranks train on while the job keeps running: the service's step only was ended.
    assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=240) == "COMPLETED"
    [attempt] = attempts(run_dir)
    assert attempt["cause"] == "completed"
    assert result(run_dir)["steps"] == 300
    assert [p.name for p in out.glob("server-*")] == [first.name]  # never started again
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert re.fullmatch(
        r"service server: stopped by ddlaunch cancel --component \(TERM; last exit -?\d+\)",
        status.stdout.splitlines()[-1],
    ), status.stdout
    batch = next((run_dir / "logs").glob("batch-*.out")).read_text()
    assert (
        "[ddlaunch] service server: stopping it, as ddlaunch cancel --component asked; "
        "the training goes on"
    ) in batch
    # The report draws the train component's rank on its node from its heartbeats, and the
    # service's one start, stopped.
    report = ddlaunch("report", run_dir.name, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report" / "report.html").read_text()
    rank_host = _rank_hosts(run_dir)[0]
    assert f"<tr><td>train</td><td>0</td><td>1 node: {rank_host}</td>" in page
    assert "<b>stopped by cancel</b>" in page


def test_replica_groups_one_per_component_restart_alone(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    # Two replica groups, one on the fast node and one on a slow node: the slow group's
    # rank killed, that group restarts alone in its own component while the other trains on.
    config = _config(
        tmp_path,
        "t-het-groups",
        [
            {"name": "fast", "nodes": {"count": 1, "gpu_type": "fast"}},
            {"name": "slow", "nodes": {"count": 1, "gpu_type": "slow"}},
        ],
        entrypoint="launch_entrypoints:mlp_step_times",
        steps=200,
        step_sleep=0.1,
        pace_s=0.3,
    )
    data = yaml.safe_load(config.read_text())
    data["parallel"] = {"dp_replicate": 2}
    data["fault_tolerance"]["mode"] = "replica_groups"
    data["health"]["heartbeat_interval"] = 1.0
    config.write_text(yaml.safe_dump(data))
    job, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    out = run_dir / "out"

    def steps_of(rank: int) -> int:
        path = out / f"steps-{rank}.txt"
        lines = path.read_text().split() if path.exists() else []
        return int(lines[-1]) if lines else -1

    _wait_for(lambda: steps_of(1) >= 40, timeout=240)
    pids = {r: int((out / f"pid-{r}.txt").read_text().split()[-1]) for r in (0, 1)}
    (out / "pace").touch()  # group 0 must not finish while group 1 is away
    os.kill(pids[1], signal.SIGKILL)
    _wait_for(
        lambda: any(
            g.get("rejoined_step") is not None
            for a in attempts(run_dir)
            for g in a.get("group_restarts") or ()
        ),
        timeout=180,
    )
    (out / "pace").unlink()
    assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=300) == "COMPLETED"
    features = _features(slurm_cluster.env)
    [attempt] = attempts(run_dir)
    (entry,) = attempt["group_restarts"]
    assert entry["group"] == 1 and entry["decision"] == "restart"
    # Its own node, in the slow component; group 0 kept its process.
    assert entry["new_nodes"] == entry["nodes"] and features[entry["nodes"][0]] == "slow"
    assert (out / "pid-0.txt").read_text().split() == [str(pids[0])]
    assert len((out / "pid-1.txt").read_text().split()) == 2
    assert result(run_dir)["steps"] == 200
