"""Checks before sbatch on the real dev cluster (3 nodes x 4 GPUs, partition debug): jobs
that could never start are refused with the numbers (``--force`` submits anyway), the
bad-node list never strands a job silently, unknown node names are caught, and a secret
passed with ``launch.env_from_submit`` reaches the ranks without being written anywhere."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.slurm_runs import TESTS, env_for, held_config, job_of

pytestmark = pytest.mark.slurm


def run(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        cwd=tmp_path,
        env={**(env or env_for(tmp_path)), "NO_COLOR": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_impossible_jobs_are_refused_before_sbatch(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    config = held_config(tmp_path, "t-big")
    four = run(tmp_path, "submit", str(config), "--set", "nodes.count=4")
    assert four.returncode == 2
    assert four.stderr == (
        "error: the job would never run, so nothing was submitted:\n"
        "  nodes.count: 4 nodes, but partition debug has 3 nodes with 1 GPU or more\n"
        "--force submits it anyway\n"
    )
    assert not (tmp_path / "runs").exists()
    forced = run(tmp_path, "submit", str(config), "--set", "nodes.count=4", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "(--force: submitted anyway)" in forced.stderr
    slurm_job_cleanup.append(job_of(forced.stdout)[1])

    # Two nodes on my bad-node list leave one for a 2-node job: said, with why and when.
    added = run(tmp_path, "nodes", "add", "node1", "node2", "--reason", "ecc", "--ttl", "2h")
    assert added.returncode == 0, added.stderr
    two = run(tmp_path, "submit", str(config), "--set", "nodes.count=2")
    assert two.returncode == 2
    lines = two.stderr.splitlines()
    assert lines[:2] == [
        "error: the job would never run, so nothing was submitted:",
        "  nodes.count: 2 nodes, but partition debug has 3 nodes with 1 GPU or more and 2 of "
        "them are excluded, which leaves 1:",
    ]
    for node, line in zip(("node1", "node2"), lines[2:4], strict=True):
        assert line.startswith(f"    {node}: on your bad-node list since ")
        assert line.endswith("(user: ecc), expires in 2.0 h"), line
    assert lines[4:] == [
        "clear listed nodes with: ddlaunch nodes remove node1 node2 (or ddlaunch nodes clear)",
        "--force submits it anyway",
    ]

    # A name the cluster does not have would make every later sbatch fail.
    ghost = run(tmp_path, "nodes", "add", "node9")
    assert ghost.returncode == 2
    assert ghost.stderr == (
        "error: node9: no such node in this cluster (it has node[1-3]); --force adds it anyway\n"
    )
    assert run(tmp_path, "nodes", "clear").returncode == 0
    assert run(tmp_path, "nodes", "add", "node9", "--force").returncode == 0
    dropped = run(tmp_path, "submit", str(config))
    assert dropped.returncode == 0, dropped.stderr
    assert (
        "warning: not excluding node9 from the bad-node list: no such node in this cluster "
        "(ddlaunch nodes remove node9)\n"
    ) in dropped.stderr
    slurm_job_cleanup.append(job_of(dropped.stdout)[1])

    doctor = run(tmp_path, "doctor", str(config), "--nodes", "5")
    assert doctor.returncode == 2
    assert (
        "  nodes.count: 5 nodes, but partition debug has 3 nodes with 1 GPU or more\n"
        in doctor.stderr
    )


def test_what_the_ranks_run_is_checked_before_sbatch(slurm_cluster, tmp_path) -> None:
    config = held_config(tmp_path, "t-launch")
    missing = run(
        tmp_path, "submit", str(config), "--set", "launch.entrypoint=launch_entrypionts:x"
    )
    assert missing.returncode == 2
    assert (
        f"  launch.entrypoint: no module 'launch_entrypionts' in {TESTS} or on this Python's "
        f"path (the job runs this same interpreter, {sys.executable})\n"
    ) in missing.stderr, missing.stderr
    script = run(
        tmp_path,
        "submit",
        str(config),
        "--set",
        "launch.entrypoint=null",
        "--set",
        "launch.script=trian.py",
    )
    assert script.returncode == 2
    assert (
        f"  launch.script: {TESTS / 'trian.py'} does not exist (the ranks run it from {TESTS}, "
        "which the nodes share with this host)\n"
    ) in script.stderr, script.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.matrix
def test_env_from_submit_reaches_the_ranks_and_is_written_nowhere(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    secret = "s3cr3t-" + os.urandom(12).hex()
    cfg = yaml.safe_load(held_config(tmp_path, "t-secret").read_text())
    cfg["sbatch"] = {}
    cfg["nodes"]["count"] = 2
    cfg["launch"]["entrypoint"] = "launch_entrypoints:secret_digest"
    cfg["launch"]["env_from_submit"] = ["DDL_TEST_SECRET"]
    config = tmp_path / "secret.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**env_for(tmp_path), "DDL_TEST_SECRET": secret}
    render = run(tmp_path, "render", str(config), env=env)
    assert "# DDL_TEST_SECRET=<from submit>\n" in render.stdout and secret not in render.stdout
    dry = run(tmp_path, "submit", str(config), "--dry-run", env=env)
    assert "--export=ALL,DDL_TEST_SECRET " in dry.stdout and secret not in dry.stdout
    unset = run(tmp_path, "submit", str(config))
    assert unset.returncode == 2
    assert "launch.env_from_submit: DDL_TEST_SECRET not set in this shell" in unset.stderr
    done = run(tmp_path, "submit", str(config), env=env)
    assert done.returncode == 0, done.stderr
    run_id, job = job_of(done.stdout)
    slurm_job_cleanup.append(job)
    assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=180) == "COMPLETED"
    run_dir = tmp_path / "runs" / run_id
    digests = [json.loads(p.read_text()) for p in sorted((run_dir / "out").glob("secret-*"))]
    assert digests == [{"sha256": hashlib.sha256(secret.encode()).hexdigest()}] * 2
    # A sweep of the same config keeps it out of members.json and its scripts too.
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {config}\nname: t-secret-sw\nlist: [{{params.x: 1}}]\n")
    swept = run(tmp_path, "sweep", str(sweep), "--hold", env=env)
    assert swept.returncode == 0, swept.stderr
    slurm_job_cleanup.append(swept.stdout.split("job ")[1].split()[0])
    written = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert len(written) > 15
    leaked = [p for p in written if secret.encode() in p.read_bytes()]
    assert leaked == []
