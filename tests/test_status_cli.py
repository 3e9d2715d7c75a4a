"""``ddlaunch status`` as a user reads it (#20, #16): whole outputs of the real CLI, piped
(one row per line), ``NO_COLOR=1``, ``COLUMNS=80``, against recorded Slurm output replayed by
stand-in commands on PATH (``support.fakes.fake_slurm_bin``)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.fakes import fake_slurm_bin, slurm_calls
from support.rundirs import T0, make_run, settle, started_sweep
from support.standin_cli import ddlaunch


def test_no_runs(tmp_path: Path) -> None:
    proc = ddlaunch(tmp_path, "status")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "runs"
    assert proc.stdout == f"no runs under {root} (ddlaunch submit CONFIG to start one)\n"


def test_the_step_never_lags_the_checkpoint(tmp_path: Path) -> None:
    # progress.json from before the resume says step 1; the job committed step 200 since
    root = tmp_path / "runs"
    make_run(root, "r", "377", T0, progress=(1, T0), ckpt=[100, 200], attempts=[{"start": T0}])
    proc = ddlaunch(tmp_path, "status", "--json", squeue="377|RUNNING|None|node1\n")
    row = json.loads(proc.stdout)[0]
    assert (row["step"], row["checkpoint_step"]) == (200, 200)
    # the freshest record wins: the watchdog's summary is newer than rank 0's progress
    make_run(root, "s", "378", T0, progress=(250, T0 + 5), watchdog={"step": 260, "time": T0 + 9})
    proc = ddlaunch(tmp_path, "status", "s", "--json", squeue="378|RUNNING|None|node1\n")
    assert json.loads(proc.stdout)[0]["step"] == 260


def test_no_stale_notes_and_rows_in_submission_order(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    # submitted last, written first: the directory's mtime is not the order
    make_run(
        root,
        "zz-finished",
        "11",
        T0 + 30,
        attempts=[{"attempt": 0, "job_id": "11", "nodes": "node1", "start": T0 + 31}],
        watchdog={"step": 40, "time": T0 + 40, "oldest_beat_age": 1.0},
        result={"final_loss": 0.1},
    )
    make_run(root, "aa-cancelled-pending", "12", T0 + 20)
    make_run(root, "mm-waiting", "13", T0 + 10)
    queue = "11|COMPLETED|None|node1\n12|CANCELLED|PartitionNodeLimit|\n13|PENDING|Priority|\n"
    proc = ddlaunch(tmp_path, "status", squeue=queue)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "run                   job  state      nodes  step  ckpt  attempts  note\n"
        "mm-waiting            13   PENDING    -         -     -         0  Priority\n"
        "aa-cancelled-pending  12   CANCELLED  -         -     -         0\n"
        "zz-finished           11   COMPLETED  node1    40     -         1\n"
    )


def test_a_sweep_row_has_one_state_and_its_members(tmp_path: Path) -> None:
    started_sweep(tmp_path / "runs", "lr", ["a", "b", "c"])
    queue = "900_0|COMPLETED|None|node1\n900_1|COMPLETED|None|node1\n900_2|RUNNING|None|node2\n"
    proc = ddlaunch(tmp_path, "status", "--json", squeue=queue)
    (row,) = json.loads(proc.stdout)
    assert row["state"] == "RUNNING" and row["members"] == {"COMPLETED": 2, "RUNNING": 1}
    assert row["attempts"] is None and row["run_id"] == "lr"


def test_member_ids_are_accepted_back(tmp_path: Path) -> None:
    sweep = started_sweep(tmp_path / "runs", "lr", ["a", "b"])
    queue = "900_0|COMPLETED|None|node1\n900_1|RUNNING|None|node2\n"
    proc = ddlaunch(tmp_path, "status", "lr/1", squeue=queue)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:3] == ["lr/1", "900_1", "RUNNING"]
    # a member's directory is labelled as the member, not as "0"
    proc = ddlaunch(tmp_path, "status", str(sweep / "members" / "0"), squeue=queue)
    assert proc.stdout.splitlines()[1].split()[:3] == ["lr/0", "900_0", "COMPLETED"]
    logs = ddlaunch(tmp_path, "logs", "lr/1")
    assert logs.returncode == 0
    assert logs.stderr == f"no log yet from rank 0 in {sweep / 'members' / '1' / 'logs'}\n"


def test_old_finished_runs_are_counted_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    done = [
        make_run(root, f"done-{i:02d}", str(100 + i), T0 + 10 * i, outcome=("COMPLETED",))
        for i in range(25)
    ]
    live = make_run(root, "live", "200", T0 - 100)
    settle(*done, live)
    queue = "200|RUNNING|None|node1\n"
    proc = ddlaunch(tmp_path, "status", squeue=queue)
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("live ") and [line.split()[0] for line in lines[2:22]] == [
        f"done-{i:02d}" for i in range(5, 25)
    ]
    assert lines[22:] == ["5 older finished runs not shown (ddlaunch status --all, or --since 7d)"]
    assert len(ddlaunch(tmp_path, "status", "--all", squeue=queue).stdout.splitlines()) == 27
    since = time.time() - (T0 + 215)  # the last three runs were submitted in this window
    proc = ddlaunch(tmp_path, "status", "--since", f"{since:.0f}s", squeue=queue)
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:-1]] == [
        "live",
        "done-22",
        "done-23",
        "done-24",
    ]
    # Their final states were cached by the first poll: later polls ask Slurm only about
    # the live run.
    squeues = [c for c in slurm_calls(tmp_path / "bin") if c.startswith("squeue")]
    assert all(" -j 200 " in f"{c} " for c in squeues[1:]), squeues


def test_a_final_state_never_changes(tmp_path: Path) -> None:
    """Cancelled between the training's last step and the job's end: result.json exists, no
    outcome. While the controller remembers the job it says CANCELLED; once it forgot it
    (no squeue row, accounting down) the run must not turn COMPLETED."""
    run = make_run(tmp_path / "runs", "r", "55", T0, result={"final_loss": 0.1}, cancel=True)
    settle(run)
    first = ddlaunch(tmp_path, "status", "--json", squeue="55|CANCELLED|None|node1\n")
    assert json.loads(first.stdout)[0]["state"] == "CANCELLED"
    later = ddlaunch(tmp_path, "status", "--json", squeue="", sacct="")
    assert json.loads(later.stdout)[0]["state"] == "CANCELLED"
    (tmp_path / "runs" / ".ddlaunch-status-cache.json").unlink()  # even without the cache
    again = ddlaunch(tmp_path, "status", "--json", squeue="", sacct="")
    assert json.loads(again.stdout)[0]["state"] == "CANCELLED"


def _read_lines(proc: subprocess.Popen[str], count: int, timeout: float) -> list[str]:
    """Up to ``count`` lines the process printed within ``timeout`` (never blocks longer:
    output a process buffers until it exits does not arrive)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while len(lines) < count:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            break
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    return lines


@pytest.mark.parametrize("as_json", [True, False])
def test_watch_in_a_pipe_prints_every_poll_as_it_comes(tmp_path: Path, as_json: bool) -> None:
    make_run(tmp_path / "runs", "r", "7", T0)
    bin_dir = fake_slurm_bin(tmp_path / "bin", squeue="7|RUNNING|None|node1\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_MIN_POLL_S": "0.2",
        "NO_COLOR": "1",
    }
    argv = ["status", "--watch", "--interval", "0.2", *(["--json"] if as_json else [])]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # the process is still running: what came out was flushed poll by poll
        lines = _read_lines(proc, 2 if as_json else 6, timeout=30)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()
    if as_json:
        assert [json.loads(line)[0]["state"] for line in lines] == ["RUNNING", "RUNNING"]
    else:
        assert lines[0].startswith("polled ") and lines[0].endswith(
            ", every 0.2 s (Ctrl-C to stop)\n"
        )
        assert lines[1:3] == [
            "run  job  state    nodes  step  ckpt  attempts\n",
            "r    7    RUNNING  node1     -     -         0\n",
        ]
        assert lines[3].startswith("polled ")


def test_a_terminal_gets_the_table_fitted_to_its_width(tmp_path: Path) -> None:
    import pty

    long_id = "a-rather-long-experiment-name-for-vit-20261201-120000-b2b2"
    make_run(tmp_path / "runs", long_id, "9", T0)
    bin_dir = fake_slurm_bin(tmp_path / "bin", squeue="9|COMPLETING|None|node[1-3]\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "NO_COLOR": "1",
        "COLUMNS": "60",
    }
    leader, follower = pty.openpty()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "status"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        check=False,
        timeout=60,
    )
    os.close(follower)
    out = os.read(leader, 65536).decode()
    os.close(leader)
    assert proc.returncode == 0, proc.stderr
    # 60 columns: the id is shortened in the middle, keeping a unique prefix and its end
    assert out.replace("\r\n", "\n") == (
        "run            job  state    nodes      step  ckpt  attempts\n"
        "a-rather…b2b2  9    RUNNING  node[1-3]     -     -         0\n"
    )


def test_a_member_that_has_not_started_is_pending_not_unreadable(tmp_path: Path) -> None:
    # Members 0 and 1 run; member 2 waits in the queue (throttled), so it has no run
    # directory yet: its job comes from the array's record, and nothing is "unreadable".
    sweep = started_sweep(tmp_path / "runs", "lr", ["a", "b", "c"])
    shutil.rmtree(sweep / "members" / "2")
    (sweep / "arrays").mkdir()
    (sweep / "arrays" / "0.json").write_text(
        json.dumps({"name": "0", "job_id": "900", "members": [0, 1, 2], "time": T0})
    )
    queue = "900_0|RUNNING|None|node1\n900_1|RUNNING|None|node1\n900_2|PENDING|JobArrayTaskLimit|\n"
    proc = ddlaunch(tmp_path, "status", "lr", squeue=queue)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        "run   job    state    nodes  step  ckpt  attempts  note",
        "lr/0  900_0  RUNNING  node1     -     -         1  params.lr=a",
        "lr/1  900_1  RUNNING  node1     -     -         1  params.lr=b",
        "lr/2  900_2  PENDING  -         -     -         0  params.lr=c; JobArrayTaskLimit",
    ]


def test_a_restart_in_the_allocation_is_starting_not_a_stale_heartbeat(tmp_path: Path) -> None:
    # Attempt 0 reached step 185 and crashed; the end hook restarted the ranks in the
    # allocation from the checkpoint at 150. Until the new attempt's watchdog polls, the run
    # directory holds attempt 0's last summary and progress: they are not the run's news.
    crashed = {
        "attempt": 0,
        "job_id": "12",
        "nodes": "node[1-2]",
        "start": T0,
        "end": T0 + 300,
        "cause": "crash",
        "committed_step": 150,
        "decision": "restart in the allocation after crash: committed step none -> 150",
    }
    again = {
        "attempt": 1,
        "job_id": "12",
        "nodes": "node[1-2]",
        "start": T0 + 305,
        "resumed_from": 150,
        "in_allocation": True,
        "relaunch": 1,
    }
    make_run(
        tmp_path / "runs",
        "r",
        "12",
        T0,
        attempts=[crashed, again],
        progress=(185, T0 + 290),
        watchdog={"time": T0 + 295, "oldest_beat_age": 1.0, "step": 185},
        ckpt=[150],
    )
    proc = ddlaunch(tmp_path, "status", "r", "--json", squeue="12|RUNNING|None|node[1-2]\n")
    (row,) = json.loads(proc.stdout)
    assert (row["state"], row["step"], row["checkpoint_step"]) == ("RUNNING", 150, 150)
    assert row["health"] == "attempt 1 starting from step 150"
