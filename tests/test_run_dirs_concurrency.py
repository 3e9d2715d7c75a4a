"""Concurrent commands on one run root, pure and local: run ids that collide get a fresh one,
a run directory appears complete or not at all, one ``resume`` of a run at a time (the lock
is the kernel's: a killed holder releases it), and names that become paths are safe tokens.
The same on the dev cluster: ``test_concurrency_slurm.py``."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.devcluster import run_ddlaunch
from support.fakes import FakeRunner, ok

from ddlaunch.app import submit as app_submit
from ddlaunch.app.prepare import prepare
from ddlaunch.store.rundir import new_run_id

REPO = Path(__file__).resolve().parent.parent


def test_a_run_id_taken_meanwhile_gets_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_submit, "write_rank_pickle", lambda run, job: None)
    # Two submits in the same second drew the same random part.
    monkeypatch.setattr("ddlaunch.store.rundir.os.urandom", lambda n: b"\x07" * n)
    first = prepare("examples/mlp", run_root=str(tmp_path / "runs"), workdir=str(tmp_path))
    (tmp_path / "runs" / first.plan.run_id).mkdir(parents=True)
    (tmp_path / "runs" / first.plan.run_id / "config.yaml").write_text("job: {}\n")
    monkeypatch.undo()
    monkeypatch.setattr(app_submit, "write_rank_pickle", lambda run, job: None)
    runner = FakeRunner({("sbatch",): ok("77\n"), ("git",): ok()})
    done = app_submit.submit_to_slurm(
        first,
        workdir=str(tmp_path),
        runner=runner,
        reprepare=lambda: prepare(
            "examples/mlp", run_root=str(tmp_path / "runs"), workdir=str(tmp_path)
        ),
    )
    assert done.run_id != first.plan.run_id
    assert (done.run_dir / "job.sbatch").read_text().count(str(done.run_dir)) >= 1
    assert (tmp_path / "runs" / first.plan.run_id / "config.yaml").read_text() == "job: {}\n"


def test_run_ids_carry_32_random_bits() -> None:
    ids = {new_run_id("mlp", now=0.0) for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i.rsplit("-", 1)[1]) == 8 for i in ids)


def _run_dir(tmp_path: Path) -> Path:
    prepared = prepare("examples/mlp", run_root=str(tmp_path / "runs"), workdir=str(tmp_path))
    run_dir = app_submit.create_run_dir(prepared, FakeRunner({("git",): ok()}), str(tmp_path))
    return run_dir.path


def test_a_second_resume_is_refused_while_one_runs(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "PATH": os.path.dirname(sys.executable),  # no sbatch here: a local resume
    }
    # What a running `resume` holds: an exclusive flock of the run's lock file.
    with open(run / ".ddlaunch.lock", "w") as held:
        held.write('{"verb": "resumed", "pid": 4321, "host": "login1", "time": 0}')
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = run_ddlaunch("resume", run.name, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        f"error: run {run.name} is already being resumed (resumed by pid 4321 on login1 since "
    ), proc.stderr
    assert proc.stderr.rstrip().endswith("run the command again once that one has finished")
    assert not (run / "history").exists()  # nothing was touched


def test_the_lock_of_a_killed_holder_is_free(tmp_path: Path) -> None:
    from ddlaunch.store import lock

    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ddlaunch.store import lock\n"
        "with lock.exclusive(Path(sys.argv[1]), 'resumed', 'run x'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        busy = r"run x is already being resumed \(resumed by pid"
        with pytest.raises(lock.Busy, match=busy), lock.exclusive(tmp_path, "resumed", "run x"):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        with lock.exclusive(tmp_path, "resumed", "run x"):
            assert time.monotonic() - started < 1
    finally:
        holder.kill()


def test_a_command_that_finds_the_lock_just_taken_still_names_its_holder(tmp_path: Path) -> None:
    """Two commands started together: the loser may look before the winner wrote its record
    (measured in CI: "by another command"); it waits a moment for it instead, and a new
    holder's record replaces a longer old one in one write (never empty, never half old)."""
    import threading

    from ddlaunch.store import lock

    path = tmp_path / ".ddlaunch.lock"
    path.write_text(
        '{"verb": "resubmitted", "pid": 1, "host": "an-old-and-long-host-name", "time": 0}'
    )
    with open(path, "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.truncate(0)  # the winner took the lock and has not written its record yet

        def write_record() -> None:
            time.sleep(0.3)
            held.write('{"verb": "resumed", "pid": 4321, "host": "login1", "time": 0}')
            held.flush()

        writer = threading.Thread(target=write_record)
        writer.start()
        busy = r"\(resumed by pid 4321 on login1 since "
        with pytest.raises(lock.Busy, match=busy), lock.exclusive(tmp_path, "resumed", "run x"):
            pass
        writer.join()
    with lock.exclusive(tmp_path, "resumed", "run x"):
        text = path.read_text()
        assert text.startswith('{"verb": "resumed", "pid": ') and text.endswith("}"), text


def test_names_that_become_paths_are_safe_tokens(tmp_path: Path) -> None:
    proc = run_ddlaunch("render", "examples/mlp", "--run-id", "../../etc/x", cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "error: --run-id '../../etc/x' must be ASCII letters, digits and _ . + - (not starting "
        "with . or -), at most 200: it becomes a path\n"
    )
    name = run_ddlaunch("render", "examples/mlp", "--set", "job.name=../x", cwd=REPO)
    assert name.returncode == 2
    assert "job.name: must be ASCII letters, digits and _ . + -" in name.stderr


def test_env_from_submit_is_shown_by_name_only(tmp_path: Path) -> None:
    env = {**os.environ, "HF_TOKEN": "hf_value_never_written"}
    render = run_ddlaunch(
        "render", "examples/mlp", "--set", "launch.env_from_submit=[HF_TOKEN]", cwd=REPO, env=env
    )
    assert render.returncode == 0, render.stderr
    assert "# HF_TOKEN=<from submit>\n" in render.stdout
    assert "hf_value_never_written" not in render.stdout
    prepared = prepare("examples/mlp", ["launch.env_from_submit=[HF_TOKEN]"], run_root="/r")
    argv = prepared.plan.sbatch_argv
    assert argv[:3] == (
        "sbatch",
        "--parsable",
        "--output=/r/" + prepared.plan.run_id + "/logs/batch-%j.out",
    )
    assert "--export=ALL,HF_TOKEN" in argv
    both = run_ddlaunch(
        "render",
        "examples/mlp",
        "--set",
        "launch.env_from_submit=[HF_TOKEN]",
        "--set",
        "launch.env={HF_TOKEN: x}",
        cwd=REPO,
    )
    assert both.returncode == 2
    assert "launch.env_from_submit: HF_TOKEN also set in launch.env" in both.stderr
