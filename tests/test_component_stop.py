"""How a service's step is stopped (``job.components``), against a stand-in of Slurm's
commands that acts as the real ones do on a TERM: srun turns a TERM it receives into a KILL
of its tasks ("srun: forcing job termination", Slurm's ``_srun_signal_mgr``), while
``scancel --signal=TERM JOB.STEP`` delivers TERM to the step's tasks. The supervisor runs
as the batch script starts it, and is stopped as the job's end stops it (TERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlaunch.job.components import Supervisor
from ddlaunch.store import components as records

# The stand-ins read and write their state in $FAKE_SLURM: srun records its one step
# (``JOB.0|NAME``, its ``--job-name``) and its task's pid, squeue lists the step, scancel
# signals the task.
SRUN = """
import os, signal, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM"])
args = sys.argv[1:]
name = next((a.split("=", 1)[1] for a in args if a.startswith("--job-name=")), "")
i = 0
while i < len(args) and args[i].startswith("-"):
    i += 1
task = subprocess.Popen(args[i:])
(state / "task.pid").write_text(str(task.pid))
(state / "steps").write_text(f"{os.environ['SLURM_JOB_ID']}.0|{name}\\n")
def on_term(signum, frame):
    print("srun: forcing job termination", file=sys.stderr, flush=True)
    (state / "srun-got-term").write_text("")
    task.kill()
signal.signal(signal.SIGTERM, on_term)
rc = task.wait()
(state / "steps").write_text("")
sys.exit(128 - rc if rc < 0 else rc)
"""
SQUEUE = """
import os, sys
from pathlib import Path
steps = Path(os.environ["FAKE_SLURM"]) / "steps"
print(steps.read_text() if steps.exists() else "", end="")
"""
SCANCEL = """
import os, signal, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM"])
sig = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--signal=")), "KILL")
with open(state / "scancel.log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
os.kill(int((state / "task.pid").read_text()), getattr(signal, "SIG" + sig))
"""
# The service: says which signal reached it, and leaves on TERM (exit 0) unless told to
# ignore it.
SERVICE = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def on_term(signum, frame):
    out.write_text("TERM")
    if sys.argv[2] == "leave":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
out.with_suffix(".ready").write_text("")
while True:
    time.sleep(0.05)
"""


def _fake_slurm(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in (("srun", SRUN), ("squeue", SQUEUE), ("scancel", SCANCEL)):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_SLURM": str(state),
        "SLURM_JOB_ID": "357",
        "DDLAUNCH_RUN_DIR": str(tmp_path / "run"),
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "service.py").write_text(SERVICE)
    return state, env


def _wait_for(probe, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_jobs_end_stops_a_service_with_term_to_its_tasks_and_says_so(
    tmp_path: Path,
) -> None:
    state, env = _fake_slurm(tmp_path)
    got = tmp_path / "got"
    argv = [
        *(sys.executable, "-m", "ddlaunch.job.components", "server", "--max-restarts", "3"),
        *("--", "srun", "--het-group=1", "--kill-on-bad-exit=1"),
        *(sys.executable, str(tmp_path / "service.py"), str(got), "leave"),
    ]
    supervisor = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run = tmp_path / "run"
    _wait_for(got.with_suffix(".ready").is_file)
    supervisor.send_signal(signal.SIGTERM)  # the batch script's trap at the job's end
    _, err = supervisor.communicate(timeout=30)
    assert supervisor.returncode == 0, err
    # The service's task got TERM (not srun's KILL), through scancel of its step.
    assert got.read_text() == "TERM"
    assert not (state / "srun-got-term").exists()
    assert (state / "scancel.log").read_text() == "--signal=TERM 357.0\n"
    record = records.read_one(run, "server")
    assert record is not None
    assert (record.state, record.last_exit, record.stop_signals) == ("stopped", 0, ("TERM",))
    assert records.describe(record) == "server: stopped at the job's end (TERM; last exit 0)"


def test_a_service_that_outlives_the_grace_after_term_gets_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, env = _fake_slurm(tmp_path)
    for key in ("PATH", "FAKE_SLURM", "SLURM_JOB_ID"):
        monkeypatch.setenv(key, env[key])
    got, said = tmp_path / "got", []
    _run_stopped(tmp_path, ["--het-group=1"], got, "stay", said, grace_s=0.5)
    # TERM through scancel first; the KILL after the grace through srun.
    assert got.read_text() == "TERM"
    assert (state / "scancel.log").read_text() == "--signal=TERM 357.0\n"
    assert (state / "srun-got-term").exists()
    record = records.read_one(tmp_path / "run", "server")
    assert record is not None and record.stop_signals == ("TERM", "KILL")
    assert records.describe(record) == (
        "server: stopped at the job's end (TERM, then KILL; last exit 137)"
    )
    assert said == [
        "[ddlaunch] service server: still running 0.5 s after TERM: KILL (srun ends its tasks)"
    ]


def _started_then_stopped(sup: Supervisor, got: Path, argv):  # type: ignore[no-untyped-def]
    child = subprocess.Popen(argv)
    _wait_for(got.with_suffix(".ready").is_file)
    sup.stop()  # what the batch script's TERM does
    return child


def test_a_step_slurm_does_not_list_is_ended_by_srun_and_recorded_as_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, env = _fake_slurm(tmp_path)
    (tmp_path / "none").mkdir()
    squeue = tmp_path / "none" / "squeue"  # lists no step (srun has not made it yet)
    squeue.write_text("#!/bin/sh\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'none'}{os.pathsep}{env['PATH']}")
    for key in ("FAKE_SLURM", "SLURM_JOB_ID"):
        monkeypatch.setenv(key, env[key])
    got, said = tmp_path / "got", []
    _run_stopped(tmp_path, [], got, "leave", said, grace_s=5.0)
    # srun turned its TERM into a KILL (137): the record says so, read from the status.
    assert not got.exists() and (state / "srun-got-term").exists()
    record = records.read_one(tmp_path / "run", "server")
    assert record is not None
    assert records.describe(record) == "server: stopped at the job's end (KILL; last exit 137)"
    assert said == [
        "[ddlaunch] service server: its step ddlaunch-service-357-server is not listed by "
        "squeue; srun is told to end it"
    ]


def _run_stopped(
    tmp_path: Path, srun_flags: list[str], got: Path, how: str, said: list[str], grace_s: float
) -> None:
    """The supervisor of job 357's service ``server`` (``service.py GOT HOW`` under srun),
    stopped once it started (``_started_then_stopped``); it must end with 0."""
    argv = ["srun", *srun_flags, sys.executable, str(tmp_path / "service.py"), str(got), how]
    sup = Supervisor("server", argv, 3, tmp_path / "run", say=said.append, job_id="357")
    sup.grace_s = grace_s
    sup.spawn = lambda argv: _started_then_stopped(sup, got, argv)  # type: ignore[assignment]
    assert sup.run() == 0
