"""The pod entry (``python -m ddlaunch.job.pod``): the contract of a pod on this machine, and
the recovery mapping from ddlaunch's one conclusion to the pods' exit codes.

The end-to-end tests run the rendered pods as local processes: each gets the container's
environment from the manifest (the downward-API fields filled in as the kubelet would, node
0's DNS name replaced by 127.0.0.1) and runs the container's command; the ranks rendezvous
over gloo across the two "pods" and the run directory is shared, as on a ReadWriteMany volume.
No API server, kubelet or JobSet controller is involved (none can run here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.kube import container_of, documents, pod_environment, pod_templates
from support.rundirs import attempt_json, committed_run, write_attempts

from ddlaunch.app.kubernetes import create_run_dir, prepare_objects
from ddlaunch.job.pod import conclude_attempt
from ddlaunch.launch.local import free_local_port
from ddlaunch.policy.pod_exit import RETRY_EXIT, STOP_EXIT
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store import attempts, outcome, pods, signal_save
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import read_failure

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
ATTEMPT = AttemptId("golden", 0, "golden")


def _open(run: Path, previous: int = 0, resumed_from: int | None = None) -> None:
    records = [
        {
            **attempts.new_record(
                i, AttemptId("golden", i, "golden"), nodes="2 pods", host="n", resumed_from=None
            ).to_json(),
            "end": 1.0,
            "cause": "crash",
        }
        for i in range(previous)
    ]
    records.append(
        attempts.new_record(previous, ATTEMPT, nodes="2 pods", host="n", resumed_from=resumed_from)
    )
    write_attempts(run, records)


def test_a_crash_after_progress_restarts_the_gang(tmp_path: Path) -> None:
    run = committed_run(tmp_path, [50])
    _open(run)
    assert conclude_attempt(run, ATTEMPT, ranks_exit=1) == RETRY_EXIT
    last = attempt_json(run)[-1]
    assert (last["cause"], last["decision"]) == (
        "crash",
        "requeue after crash: committed step none -> 50",
    )
    decided = pods.read_decision(run, ATTEMPT)
    assert decided is not None and decided.exit_code == RETRY_EXIT
    assert outcome.read_outcome(run) is None


def test_a_crash_without_progress_stops(tmp_path: Path) -> None:
    run = committed_run(tmp_path, [50])
    _open(run, resumed_from=50)
    assert conclude_attempt(run, ATTEMPT, ranks_exit=1) == STOP_EXIT
    record = outcome.read_outcome(run)
    assert record.state == "FAILED"
    assert (
        record.reason
        == "stopped: no progress in the last attempt (the committed step stayed at 50)"
    )


def test_the_requeue_cap_stops(tmp_path: Path) -> None:
    run = committed_run(tmp_path, [50], "fault_tolerance: {max_requeues: 2}\n")
    _open(run, previous=2)
    assert conclude_attempt(run, ATTEMPT, ranks_exit=1) == STOP_EXIT
    assert outcome.read_outcome(run).reason == (
        "stopped: 2 requeues reached fault_tolerance.max_requeues=2"
    )


def test_completion_and_a_signal_save(tmp_path: Path) -> None:
    run = committed_run(tmp_path, [300])
    _open(run)
    assert conclude_attempt(run, ATTEMPT, ranks_exit=0) == 0
    assert outcome.read_outcome(run).state == "COMPLETED"
    run2 = committed_run(tmp_path / "b", [60])
    _open(run2)
    signal_save.write(run2, ATTEMPT, 60, "SIGTERM")  # rank 0 saved on Kubernetes' SIGTERM
    assert conclude_attempt(run2, ATTEMPT, ranks_exit=0) == RETRY_EXIT
    assert attempt_json(run2)[-1]["cause"] == "signal"


def _pod_run(tmp_path: Path, entry: str, ranks_per_node: int) -> tuple[Path, list[dict]]:
    config = tmp_path / "pods.yaml"
    config.write_text(
        f"job: {{name: pods}}\n"
        f"nodes: {{count: 2, tasks_per_node: {ranks_per_node}}}\n"
        f"launch: {{entrypoint: '{entry}', backend: gloo, python: '{sys.executable}'}}\n"
        "container: {image: 'python:3.11'}\n"
        f"kubernetes: {{volumes: {{'{tmp_path}': 'pvc:shared'}}}}\n"
    )
    prepared = prepare_objects(
        str(config), run_id="podrun", run_root=str(tmp_path / "runs"), snapshot="skip"
    )
    run_dir = create_run_dir(prepared, SubprocessRunner(), str(tmp_path)).path
    return run_dir, pod_templates(documents(prepared))


def _start_pods(run_dir: Path, template: dict, port: int) -> list[subprocess.Popen[str]]:
    procs = []
    for index in range(2):
        env = pod_environment(template, index=index, node=f"pod-{index}")
        env.update(
            DDLAUNCH_K8S_MASTER_ADDR="127.0.0.1",  # node 0's DNS name, on this machine
            DDLAUNCH_MASTER_PORT=str(port),
            PATH=os.environ["PATH"],
            HOME=str(run_dir.parent),
            PYTHONPATH=f"{REPO}:{TESTS}",
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                container_of(template)["command"],
                env=env,
                cwd=TESTS,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out.append((proc.returncode, text))
    return out


def test_two_pods_run_one_job_and_node_0_concludes(tmp_path: Path) -> None:
    run_dir, (template,) = _pod_run(tmp_path, "launch_entrypoints:world_info", 2)
    port = free_local_port()
    results = _finish(_start_pods(run_dir, template, port))
    assert [code for code, _ in results] == [0, 0], results
    records = [json.loads((run_dir / "out" / f"rank-{r}.json").read_text()) for r in range(4)]
    # One rank per "GPU" slot, node-major, all in one group around node 0.
    assert [(r["rank"], r["local_rank"], r["world_size"]) for r in records] == [
        (0, 0, 4),
        (1, 1, 4),
        (2, 0, 4),
        (3, 1, 4),
    ]
    assert {r["master"] for r in records} == {f"127.0.0.1:{port}"}
    assert {r["rank_sum"] for r in records} == {6.0}
    (attempt,) = attempt_json(run_dir)
    assert (attempt["job_id"], attempt["cause"], attempt["batch_host"]) == (
        "podrun",
        "completed",
        "pod-0",
    )
    assert outcome.read_outcome(run_dir).state == "COMPLETED"
    decided = pods.read_decision(run_dir, AttemptId("podrun", 0, "podrun"))
    assert decided is not None and decided.exit_code == 0
    assert "node 0 concluded: completed" in results[1][1]
    assert (run_dir / "logs" / "rank-3.out").is_file()


def test_a_failed_rank_on_node_0_stops_every_pod_with_the_stop_code(tmp_path: Path) -> None:
    run_dir, (template,) = _pod_run(tmp_path, "launch_entrypoints:fail_on_rank_0", 1)
    results = _finish(_start_pods(run_dir, template, free_local_port()))
    # Node 1's rank would sleep two minutes: its pod ends it on node 0's decision.
    assert [code for code, _ in results] == [STOP_EXIT, STOP_EXIT], results
    record = outcome.read_outcome(run_dir)
    assert record.state == "FAILED"
    assert (
        record.reason
        == "stopped: no progress in the last attempt (no checkpoint was ever committed)"
    )
    failure = read_failure(run_dir, 0)
    assert failure is not None
    assert (failure.exception, failure.message) == ("ValueError", "boom on rank 0")


@pytest.fixture(autouse=True)
def _no_slurm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(name)


STATUS_TABLE = """\
run     job     state       nodes   step  ckpt  attempts
podrun  podrun  RESTARTING  2 pods    40    40         2
attempt 0: job podrun on 2 pods at 22:13:20 60s, from scratch -> restarted by Kubernetes (committed 20)
attempt 1: job podrun on 2 pods at 22:15:00 30s, from step 20 -> crash (committed 40)
"""


def test_status_target_kubernetes_reads_the_pods_records(tmp_path: Path) -> None:
    """``status RUN --target kubernetes``: the state from the run directory alone (no
    scheduler is asked), as the pods' leader recorded it on the shared volume."""
    config = tmp_path / "c.yaml"
    config.write_text(
        "job: {name: pods}\nnodes: {count: 2}\nlaunch: {entrypoint: 'a.b:c'}\n"
        f"container: {{image: 'python:3.11'}}\nkubernetes: {{volumes: {{'{tmp_path}': 'pvc:x'}}}}\n"
    )
    from ddlaunch.app.kubernetes import submit_objects

    prepared = prepare_objects(
        str(config), run_id="podrun", run_root=str(tmp_path / "runs"), snapshot="skip"
    )
    done = submit_objects(prepared, workdir=str(tmp_path), env={"PATH": str(tmp_path)})
    assert (done.applied, done.why_not) == (False, "no kubectl on PATH")
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": "100",
        "TZ": "UTC",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "PATH": str(Path(sys.executable).parent),
    }

    def status() -> str:
        argv = [sys.executable, "-m", "ddlaunch", "status", "podrun", "--target", "kubernetes"]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return proc.stdout

    def row() -> list[str]:  # the run's row, cells split where the plain table has 2+ spaces
        line = next(x for x in status().splitlines() if x.startswith("podrun "))
        return re.split(r"\s{2,}", line.strip())

    assert row()[:4] == ["podrun", "podrun", "NOT_APPLIED", "-"]
    # Unchanged for longer than the status cache waits before it keeps a queued run: the
    # state still comes from the run's intent (which names the target), poll after poll.
    past = time.time() - 60
    os.utime(done.run_dir, (past, past))
    assert row()[:4] == ["podrun", "podrun", "NOT_APPLIED", "-"]
    assert row()[:4] == ["podrun", "podrun", "NOT_APPLIED", "-"]
    first = attempts.new_record(
        0, AttemptId("podrun", 0, "podrun"), nodes="2 pods", host="a", resumed_from=None
    )
    first = replace(
        first,
        start=1700000000.0,
        end=1700000060.0,
        cause="restarted by Kubernetes",
        committed_step=20,
    )
    second = attempts.new_record(
        1, AttemptId("podrun", 1, "podrun"), nodes="2 pods", host="a", resumed_from=20
    )
    second = replace(second, start=1700000100.0)
    write_attempts(done.run_dir, [first, second])
    assert row()[:4] == ["podrun", "podrun", "RUNNING", "2 pods"]
    second = replace(second, end=1700000130.0, cause="crash", committed_step=40)
    write_attempts(done.run_dir, [first, second])
    ckpt = done.run_dir / "checkpoints" / "step-40"
    ckpt.mkdir(parents=True)
    (ckpt / ".metadata").write_text("x")
    (ckpt / ".ddlaunch-commit.json").write_text(
        json.dumps({"format": 1, "step": 40, "time": 1.0, "world_size": 4, "num_shard_files": 4})
    )
    assert status() == STATUS_TABLE
