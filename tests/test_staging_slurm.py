"""Data staging on the real dev cluster, across the four things that happen to a node's copy:
a staging killed with SIGKILL (not taken as complete; the next one continues it), a resume
on the same nodes (only the rest is copied), a requeue onto the same nodes (nothing copied),
and a node that dies (the run moves to a node that stages from scratch, while the node that
stays waits for it with its copy up to date). Bytes are counted
in the nodes' staging records; the ranks check the data they were given against the source.

The nodes share this machine's filesystem, so storage.scratch has {node} in it: each node
has its own copy, as with node-local disks. With the cluster to itself (the lock), Slurm puts
a two-node job on the first two idle nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import yaml
from support.devcluster import FINAL_STATES, run_ddlaunch, wait_for
from support.slurm_runs import TESTS

from ddlaunch.planning.staging import default_dst, node_path
from ddlaunch.store import stage_manifest

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
FILES, SIZE = 40, 50_000


def make_dataset(root: Path) -> tuple[Path, int, str]:
    src = root / "dataset"
    for i in range(FILES):
        path = src / f"shard-{i % 4}" / f"{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.sha256(str(i).encode()).digest() * (SIZE // 32))
    digest = hashlib.sha256()
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(src)).encode())
        digest.update(file.read_bytes())
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    return src, total, digest.hexdigest()


def record(run_dir: Path, job: str, restart: int, host: str) -> dict:
    path = run_dir / "staging" / f"{job}-{restart}" / f"{host}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def data_seen(run_dir: Path, job: str, restart: int) -> list[dict]:
    return [
        json.loads(p.read_text()) for p in sorted((run_dir / "out").glob(f"data-{job}-{restart}-*"))
    ]


@pytest.mark.lane
def test_staging_survives_a_kill_a_requeue_and_a_node_failure(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    first, second, third = slurm_cluster.nodes[:3]
    src, total, digest = make_dataset(tmp_path)
    scratch = f"/var/tmp/ddlaunch-test-{uuid.uuid4().hex[:8]}/{{node}}"
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": "stage-e2e", "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 2, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "launch_entrypoints:staged_mlp",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
        "storage": {"scratch": scratch, "stage": [{"name": "train", "src": str(src)}]},
        "health": {"preflight": False},
        "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0, "max_requeues": 3},
        "params": {"steps": 200, "lr": 0.05, "batch_size": 64, "seed": 0, "step_sleep": 0.05},
    }
    config = tmp_path / "stage.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad_nodes.json"),
    }
    copy_on = {n: Path(default_dst(node_path(scratch, n), "train", str(src))) for n in (first,)}

    def item(job: str, restart: int, host: str) -> dict:
        return record(run_dir, job, restart, host)["items"][0]

    try:
        # 1. The first node's staging is killed (SIGKILL) after 12 files; the second node's
        # finishes, and waits for the first, until srun ends the step.
        inject = json.dumps([{"index": 0, "restart": 0, "stage_kill_after_files": 12}])
        proc = run_ddlaunch(
            "submit", str(config), cwd=tmp_path, env={**env, "DDLAUNCH_HEALTH_INJECT": inject}
        )
        assert proc.returncode == 0, proc.stderr
        run_id, job1 = proc.stdout.split()[1], proc.stdout.split()[3]
        slurm_job_cleanup.append(job1)
        run_dir = tmp_path / "runs" / run_id
        slurm_cluster.wait_job_state(job1, FINAL_STATES, timeout=180)
        assert record(run_dir, job1, 0, first)["state"] == "running"  # never finished
        assert (item(job1, 0, second)["state"], item(job1, 0, second)["bytes"]) == (
            "copied",
            total,
        )
        dst = copy_on[first]
        assert not dst.exists() and not stage_manifest.path(dst).exists()
        partial = dst.with_name(dst.name + ".partial")
        done = len(list(partial.rglob("*.bin")))
        assert 12 <= done < FILES

        # 2. Resumed on the same nodes: the first copies only the rest, the second nothing.
        proc = run_ddlaunch(
            "resume", run_id, "--set", "health.preflight=true", cwd=tmp_path, env=env
        )
        assert proc.returncode == 0, proc.stderr
        job2 = next(x for x in proc.stdout.splitlines() if x.startswith("run ")).split()[3]
        slurm_job_cleanup.append(job2)
        wait_for(lambda: progress_step(run_dir) >= 30, 180, "step 30 of the resumed job")
        assert (item(job2, 0, first)["state"], item(job2, 0, first)["files"]) == (
            "copied",
            FILES - done,
        )
        assert 0 < item(job2, 0, first)["bytes"] < total
        assert (item(job2, 0, second)["state"], item(job2, 0, second)["bytes"]) == ("up to date", 0)
        seen = {(d["host"], d["path"], d["sha256"]) for d in data_seen(run_dir, job2, 0)}
        assert {(h, s) for h, _, s in seen} == {(first, digest), (second, digest)}
        assert (first, str(dst), digest) in seen

        # 3. The pre-timeout signal: the ranks save and requeue; back on the same nodes, the
        # copies are up to date and nothing is copied.
        slurm_cluster.signal_job(job2, "USR2")
        wait_for(lambda: staging_done(run_dir, job2, 1), 120, "the requeued attempt's staging")
        for host in (first, second):
            assert (item(job2, 1, host)["state"], item(job2, 1, host)["bytes"]) == ("up to date", 0)
        resumed = json.loads((run_dir / "attempts.json").read_text())[-1]["resumed_from"]
        wait_for(lambda: progress_step(run_dir) >= resumed + 10, 120, "training after requeue")

        # 4. The second node dies: the run moves to the first and the third node; the third
        # stages from scratch while the first waits for it with an up-to-date copy.
        slurm_cluster.kill_node(second)
        try:
            assert slurm_cluster.wait_job_state(job2, "COMPLETED", timeout=300) == "COMPLETED"
        finally:
            slurm_cluster.revive_node(second)
        attempts = json.loads((run_dir / "attempts.json").read_text())
        assert slurm_cluster.hostnames(attempts[-1]["nodes"]) == [first, third], attempts
        last = attempts[-1]["restart_count"]
        assert (item(job2, last, first)["state"], item(job2, last, first)["bytes"]) == (
            "up to date",
            0,
        )
        fresh = item(job2, last, third)
        assert (fresh["state"], fresh["files"], fresh["bytes"]) == ("copied", FILES, total)
        assert {d["sha256"] for d in data_seen(run_dir, job2, last)} == {digest}

        # status shows the last attempt's staging per node.
        proc = run_ddlaunch("status", run_id, "--json", cwd=tmp_path, env=env)
        (row,) = json.loads(proc.stdout)
        assert row["staging"][third]["copied_bytes"] == total
        assert row["staging"][first]["copied_bytes"] == 0
    finally:
        shutil.rmtree(scratch.split("/{node}")[0], ignore_errors=True)


def staging_done(run_dir: Path, job: str, restart: int) -> bool:
    return (run_dir / "staging" / f"{job}-{restart}.done.json").exists()


@pytest.mark.matrix
def test_sbcast_broadcasts_a_file_once_and_not_again(slurm_cluster, slurm_job_cleanup, tmp_path):
    """mode sbcast on one node (the dev cluster's nodes share a filesystem, and sbcast writes
    the same path on every node)."""
    src = tmp_path / "shard.bin"
    src.write_bytes(hashlib.sha256(b"shard").digest() * 100_000)  # 3.2 MB
    expected = hashlib.sha256(b"shard.bin" + src.read_bytes()).hexdigest()
    root = Path(f"/var/tmp/ddlaunch-test-{uuid.uuid4().hex[:8]}")
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": "stage-sbcast", "time": "00:05:00"},
        "nodes": {"count": 1, "gpus_per_node": 2, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "launch_entrypoints:staged_mlp",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
        "storage": {
            "stage": [
                {"name": "train", "src": str(src), "dst": str(root / "shard"), "mode": "sbcast"}
            ]
        },
        "params": {"steps": 20, "lr": 0.05, "batch_size": 64, "seed": 0},
    }
    config = tmp_path / "sbcast.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad_nodes.json"),
    }
    try:
        runs = []
        for _ in range(2):  # a run, then a second run of the same data on the same node
            pin = f"nodes.nodelist=[{slurm_cluster.nodes[0]}]"
            proc = run_ddlaunch("submit", str(config), "--set", pin, cwd=tmp_path, env=env)
            assert proc.returncode == 0, proc.stderr
            run_id, job = proc.stdout.split()[1], proc.stdout.split()[3]
            slurm_job_cleanup.append(job)
            assert slurm_cluster.wait_job_state(job, "COMPLETED", timeout=180) == "COMPLETED"
            runs.append((tmp_path / "runs" / run_id, job))
        host = slurm_cluster.nodes[0]
        (first_dir, first_job), (second_dir, second_job) = runs
        sent = json.loads((first_dir / f"staging/{first_job}-0/sbcast/train.json").read_text())
        assert sent == {"sent": True, "votes": {host: True}}
        items = record(first_dir, first_job, 0, host)["items"]
        assert (items[0]["state"], items[0]["bytes"]) == ("copied", src.stat().st_size)
        assert {d["sha256"] for d in data_seen(first_dir, first_job, 0)} == {expected}
        again = json.loads((second_dir / f"staging/{second_job}-0/sbcast/train.json").read_text())
        assert again == {"sent": False, "votes": {host: False}}  # up to date: nothing sent
        assert record(second_dir, second_job, 0, host)["items"][0]["state"] == "up to date"
        assert {d["sha256"] for d in data_seen(second_dir, second_job, 0)} == {expected}
    finally:
        shutil.rmtree(root, ignore_errors=True)
