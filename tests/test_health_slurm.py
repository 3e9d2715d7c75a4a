"""Node health on the real dev cluster: preflight exclusion, hang detection, status and report.

Two runs are submitted together at the start of the module (they share the 3-node cluster):

* ``pf2``: 2 nodes; the second node of attempt 0 reports no free space (fault injection
  through $DDLAUNCH_HEALTH_INJECT) -> excluded before any step; attempt 1 runs on the others.
* ``three``: 1 node x 2 ranks, requeued twice: attempt 0's node has a missing GPU ->
  excluded by preflight; in attempt 1 rank 1 sleeps forever at step 40 -> the watchdog
  detects the hang, its node is excluded; attempt 2 finishes on the third node.

Every job id is cancelled at the end; the bad-node list is a temporary file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch as _ddlaunch

TESTS = Path(__file__).resolve().parent
# The three tests share the module's two runs, one of which walks all three nodes.
pytestmark = [pytest.mark.slurm, pytest.mark.lane, pytest.mark.xdist_group("health_runs")]
HANG_TIMEOUT = 30


def mlp_hang(config):  # runs on the compute nodes (launch.entrypoint test_health_slurm:...)
    from ddlaunch.examples import mlp

    p = config.params
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def on_step(step: int) -> None:
        if (
            restart == int(p.get("hang_restart", -1))
            and step == int(p.get("hang_step", -1))
            and os.environ.get("RANK") == str(p.get("hang_rank", 1))
        ):
            out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
            out.mkdir(exist_ok=True)
            (out / "hang.json").write_text(json.dumps({"time": time.time(), "step": step}))
            time.sleep(10**6)

    return mlp.main(config, on_step=on_step)


def _config(tmp: Path, name: str, nodes: int, params: dict) -> Path:
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:08:00"},
        "nodes": {"count": nodes, "gpus_per_node": 2, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "test_health_slurm:mlp_hang",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
        "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0, "max_requeues": 3},
        "health": {"hang_timeout": HANG_TIMEOUT, "heartbeat_interval": 2},
        "params": {"steps": 100, "lr": 0.05, "batch_size": 64, "seed": 0, **params},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("health")
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp / "bad_nodes.json"),
        "SLURM_CONF": slurm_cluster.env["SLURM_CONF"],
    }
    specs = {
        "pf2": (2, {}, [{"index": 1, "restart": 0, "free_gb": 0}]),
        "three": (
            1,
            {"hang_restart": 1, "hang_step": 40, "hang_rank": 1, "step_sleep": 0.05},
            [{"index": 0, "restart": 0, "gpus": 1}],
        ),
    }
    submitted = {}
    job_ids = []
    try:
        for name, (nodes, params, inject) in specs.items():
            config = _config(tmp, f"h-{name}", nodes, params)
            proc = _ddlaunch(
                "submit",
                str(config),
                cwd=tmp,
                env={**env, "DDLAUNCH_HEALTH_INJECT": json.dumps(inject)},
            )
            assert proc.returncode == 0, proc.stderr
            first = proc.stdout.splitlines()[0].split()
            job_ids.append(first[3])
            submitted[name] = (first[3], tmp / "runs" / first[1], time.monotonic())
        yield {"tmp": tmp, "env": env, "runs": submitted, "cluster": slurm_cluster}
    finally:
        slurm_cluster.cancel(job_ids)


def _finish(runs, name: str, timeout: float) -> tuple[str, Path, list[dict]]:
    job_id, run_dir, _ = runs["runs"][name]
    state = runs["cluster"].wait_job_state(job_id, "COMPLETED", timeout=timeout)
    assert state == "COMPLETED"
    return job_id, run_dir, json.loads((run_dir / "attempts.json").read_text())


def _batch_log(run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((run_dir / "logs").glob("batch-*.out")))


def test_node_failing_preflight_is_excluded_before_training(runs) -> None:
    _, run_dir, attempts = _finish(runs, "pf2", timeout=240)
    assert [a["cause"] for a in attempts] == ["preflight", "completed"], attempts
    cluster = runs["cluster"]
    first_nodes = cluster.hostnames(attempts[0]["nodes"])
    victim = first_nodes[1]
    assert attempts[0]["blamed"] == [victim]
    assert attempts[0]["committed_step"] is None  # no training step ran in attempt 0
    assert "disk:checkpoints" in attempts[0]["health"]
    assert victim not in cluster.hostnames(attempts[1]["nodes"])
    assert json.loads((run_dir / "excluded_nodes.json").read_text()) == [victim]
    # The ranks of attempt 0 ran the preflight and stopped at its gate: no training step ran
    # (no heartbeat, no step history of that attempt).
    assert "no training in this attempt" in (run_dir / "logs" / "rank-0.out").read_text()
    steps = (run_dir / "health" / "steps.jsonl").read_text().splitlines()
    assert all(json.loads(line)["restart"] == 1 for line in steps), steps
    gate = json.loads((run_dir / "health" / f"gate-{attempts[0]['job_id']}-0.json").read_text())
    assert gate["passed"] is False and victim in gate["reason"]
    # Both attempts measured the all-reduce bandwidth between their two nodes.
    log = _batch_log(run_dir)
    assert log.count("Gbit/s ring") == 4, log
    bad = json.loads(Path(runs["env"]["DDLAUNCH_BAD_NODES"]).read_text())
    # The list is shared by both runs (the other may have blamed the same node since).
    entry = next(e for e in bad if e["node"] == victim)
    assert entry["expires"] > time.time() and entry["source"].startswith("run h-")


def test_hang_is_detected_node_excluded_and_run_finishes_elsewhere(runs) -> None:
    job_id, run_dir, attempts = _finish(runs, "three", timeout=300)
    assert [a["cause"] for a in attempts] == ["preflight", "hang", "completed"], attempts
    nodes = [a["nodes"] for a in attempts]
    assert len(set(nodes)) == 3, nodes  # each attempt on another node
    assert "gpus" in attempts[0]["health"]
    hang = attempts[1]
    assert hang["blamed"] == [hang["nodes"]]
    assert "rank 1 " in hang["health"] and "test_health_slurm.py" in hang["health"]
    verdict = json.loads((run_dir / "health" / f"verdict-{job_id}-1.json").read_text())
    # Detected within hang_timeout + 30 s of the moment the rank stopped.
    hung_at = json.loads((run_dir / "out" / "hang.json").read_text())["time"]
    assert verdict["time"] - hung_at <= HANG_TIMEOUT + 30, verdict["time"] - hung_at
    assert "[ddlaunch watchdog] hang" in _batch_log(run_dir)
    # Step 40's save was still in flight when rank 1 stopped: it resumes from the last commit.
    assert attempts[2]["resumed_from"] == hang["committed_step"] >= 20
    assert sorted(json.loads((run_dir / "excluded_nodes.json").read_text())) == sorted(
        [attempts[0]["nodes"], attempts[1]["nodes"]]
    )
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == hang["committed_step"] and result["final_loss"] < 0.05


def test_status_and_report_show_every_attempt_and_cause(runs) -> None:
    _finish(runs, "three", timeout=300)
    _, run_dir, _ = runs["runs"]["three"]
    env, tmp = runs["env"], runs["tmp"]
    proc = _ddlaunch("status", run_dir.name, "--json", cwd=tmp, env=env)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)[0]
    assert row["state"] == "COMPLETED" and row["attempts"] == 3
    assert [a["cause"] for a in row["history"]] == ["preflight", "hang", "completed"]
    assert "preflight failed on" in row["health"] and "hang on" in row["health"]
    text = _ddlaunch("status", run_dir.name, cwd=tmp, env={**env, "COLUMNS": "200"})
    assert "-> preflight" in text.stdout and "-> hang" in text.stdout, text.stdout
    report = _ddlaunch("report", run_dir.name, "--out", str(tmp / "report"), cwd=tmp, env=env)
    assert report.returncode == 0, report.stderr
    html = (tmp / "report" / "report.html").read_text()
    png = (tmp / "report" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "data:image/png;base64," in html
    for cause in ("preflight", "hang", "completed"):
        assert cause in html
