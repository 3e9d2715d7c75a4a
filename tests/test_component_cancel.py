"""``ddlaunch cancel RUN --component NAME``: a service's supervisor stops the service when
asked (real processes), records it and its history; the CLI's whole output for each case."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from support.components import COMPONENTS_CONFIG
from support.rundirs import T0, make_run
from support.standin_cli import ddlaunch

from ddlaunch.job.components import Supervisor
from ddlaunch.store import components as records

RUNNING_ATTEMPT = {"attempt": 0, "job_id": "12", "nodes": "node[1-3]", "start": T0}
SQUEUE_RUNNING = "12|RUNNING|None|node[1-4]\n"


def _run(tmp_path: Path, config: str = COMPONENTS_CONFIG) -> Path:
    return make_run(tmp_path / "runs", "r", "12", T0, attempts=[RUNNING_ATTEMPT], config=config)


# ------------------------------------------------------------------ the supervisor


def test_the_supervisor_stops_the_service_when_asked_and_does_not_start_it_again(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    sup = Supervisor(
        "server", ["sleep", "60"], 3, tmp_path, say=said.append, job_id="12", poll_s=0.1
    )
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(sup.run()))
    started = time.monotonic()
    thread.start()
    while records.read_one(tmp_path, "server") is None:
        time.sleep(0.02)
    child = sup.child
    assert child is not None and child.poll() is None
    records.request_stop(tmp_path, "server", "12")
    thread.join(timeout=10)
    assert done == [0] and time.monotonic() - started < 10
    assert child.returncode == -15  # its step was ended (TERM), not left behind
    assert said == [
        "[ddlaunch] service server: stopping it, as ddlaunch cancel --component asked; "
        "the training goes on"
    ]
    state = records.read_one(tmp_path, "server")
    assert state is not None
    assert (state.state, state.reason, state.starts, state.last_exit, state.job_id) == (
        "stopped",
        "cancelled",
        1,
        -15,
        "12",
    )
    assert records.describe(state) == (
        "server: stopped by ddlaunch cancel --component (TERM; last exit -15)"
    )
    (run,) = state.history
    assert run.exit == -15 and run.end is not None and run.start <= run.end


def test_a_request_for_another_job_is_not_for_this_one(tmp_path: Path) -> None:
    """A stop asked of an earlier job (before a resume) does not stop the new job's service."""
    records.request_stop(tmp_path, "server", "11")
    sup = Supervisor("server", ["true"], 0, tmp_path, say=lambda _: None, job_id="12")
    assert sup.run() == 0
    state = records.read_one(tmp_path, "server")
    assert state is not None and (state.state, state.reason) == ("ended", "")


def test_a_service_asked_to_stop_before_it_starts_is_never_started(tmp_path: Path) -> None:
    records.request_stop(tmp_path, "server", "12")
    marker = tmp_path / "started"
    sup = Supervisor("server", ["touch", str(marker)], 3, tmp_path, say=lambda _: None, job_id="12")
    assert sup.run() == 0
    assert not marker.exists()
    state = records.read_one(tmp_path, "server")
    assert state is not None and (state.state, state.starts, state.history) == ("stopped", 0, ())


def test_the_history_keeps_every_start_and_end_across_jobs_and_is_bounded(
    tmp_path: Path,
) -> None:
    count = tmp_path / "starts"
    script = f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; [ "$n" -ge 2 ]'
    first = Supervisor(
        "server",
        ["sh", "-c", script],
        3,
        tmp_path,
        sleep=lambda _: None,
        say=lambda _: None,
        job_id="12",
    )
    assert first.run() == 0
    state = records.read_one(tmp_path, "server")
    assert state is not None
    assert [r.exit for r in state.history] == [1, 1, 0]
    assert all(r.end is not None and r.start <= r.end for r in state.history)
    # The next job's supervisor goes on with the history (one file per service).
    second = Supervisor("server", ["false"], 0, tmp_path, say=lambda _: None, job_id="13")
    assert second.run() == 1
    state = records.read_one(tmp_path, "server")
    assert state is not None
    assert ([r.exit for r in state.history], state.starts, state.state) == (
        [1, 1, 0, 1],
        1,
        "failed",
    )
    assert sorted(p.name for p in (tmp_path / "components").iterdir()) == ["server.json"]
    # Past the limit the oldest starts go and are counted.
    for i in range(records.HISTORY_LIMIT + 5):
        state = records.with_run(state, records.ServiceRun(float(i)))
    assert len(state.history) == records.HISTORY_LIMIT
    assert (state.history[0].start, state.earlier) == (5.0, 9)  # 4 + 105 starts


def test_a_record_of_an_earlier_version_is_read_without_history(tmp_path: Path) -> None:
    path = tmp_path / "components" / "server.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"name": "server", "state": "running", "starts": 2, "time": 5}))
    state = records.read_one(tmp_path, "server")
    assert state == records.ServiceState("server", "running", 2, None, 5.0)


# ------------------------------------------------------------------ the CLI


def test_cancel_of_a_service_writes_the_request_and_says_what_follows(tmp_path: Path) -> None:
    run = _run(tmp_path)
    proc = ddlaunch(tmp_path, "cancel", "r", "--component", "server", squeue=SQUEUE_RUNNING)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "r: asked the supervisor of service server in job 12 to stop it; it looks every 1 s, "
        "ends the service's step and records it stopped, without starting it again; the "
        "training goes on (`ddlaunch status r` says when)\n"
    )
    request = records.read_stop_request(run, "server")
    assert request is not None and request.job_id == "12"
    # Nothing was cancelled in Slurm, and the run is not marked cancelled.
    assert not (tmp_path / "bin" / "scancelled").exists()
    assert not (run / "cancel.json").exists()


def test_cancel_of_a_service_already_stopped_says_so(tmp_path: Path) -> None:
    run = _run(tmp_path)
    records.write(
        run,
        records.ServiceState(
            "server", records.STOPPED, 1, -15, T0 + 9, reason="cancelled", job_id="12"
        ),
    )
    proc = ddlaunch(tmp_path, "cancel", "r", "--component", "server", squeue=SQUEUE_RUNNING)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "r: service server: stopped by ddlaunch cancel --component (last exit -15) in job 12; "
        "nothing to stop\n"
    )


def test_cancel_of_a_service_of_a_pending_job(tmp_path: Path) -> None:
    make_run(tmp_path / "runs", "r", "12", T0, config=COMPONENTS_CONFIG)
    proc = ddlaunch(
        tmp_path, "cancel", "r", "--component", "server", squeue="12|PENDING|Priority|\n"
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "r: asked that service server not be started in job 12 (PENDING); the job and its "
        "training will start without it\n"
    )


def test_cancel_of_a_train_component_or_an_unknown_one_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    train = ddlaunch(tmp_path, "cancel", "r", "--component", "slow", squeue=SQUEUE_RUNNING)
    assert (train.returncode, train.stdout) == (2, "")
    assert train.stderr == (
        "error: slow is a train component of r: the train components' ranks are one training "
        "world, which stops as a whole (cancel the run: `ddlaunch cancel r`)\n"
    )
    unknown = ddlaunch(tmp_path, "cancel", "r", "--component", "sever", squeue=SQUEUE_RUNNING)
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == (
        "error: r has no component 'sever'; its components: fast (train), slow (train), "
        "server (service)\n"
    )
    assert not (run / "components").exists()


def test_cancel_component_of_a_run_without_components_or_ended_or_of_two_runs(
    tmp_path: Path,
) -> None:
    make_run(tmp_path / "runs", "plain", "12", T0, attempts=[RUNNING_ATTEMPT])
    plain = ddlaunch(tmp_path, "cancel", "plain", "--component", "server", squeue=SQUEUE_RUNNING)
    assert (plain.returncode, plain.stdout) == (2, "")
    assert plain.stderr == (
        "error: plain has no components: --component stops a service of a run with components "
        "(cancel the run with `ddlaunch cancel plain`)\n"
    )
    make_run(
        tmp_path / "runs",
        "done",
        "14",
        T0,
        config=COMPONENTS_CONFIG,
        attempts=[{**RUNNING_ATTEMPT, "job_id": "14", "end": T0 + 60, "cause": "completed"}],
        outcome=("COMPLETED", "completed"),
    )
    ended = ddlaunch(tmp_path, "cancel", "done", "--component", "server")
    assert (ended.returncode, ended.stdout) == (2, "")
    assert ended.stderr == (
        "error: done is COMPLETED, no job of it runs or waits: service server is not running\n"
    )
    assert not (tmp_path / "runs" / "done" / "components").exists()
    two = ddlaunch(tmp_path, "cancel", "plain", "done", "--component", "server")
    assert two.returncode == 2 and two.stdout == ""
    assert two.stderr.splitlines()[-1] == (
        "Error: --component stops a service of one RUN: name one run"
    )
