"""Whole-output CLI tests of following a run: ``logs -f`` (a finished run, file headers at every
switch, the final state, Ctrl-C) and the ``submit --local`` stream. They import no ddlaunch
module, so they run (and fail) on a ddlaunch without the follow engine too."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from support.rundirs import example_run_dir

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80"}


def write_outcome(run: Path, state: str, reason: str) -> None:
    (run / "outcome.json").write_text(json.dumps({"state": state, "reason": reason}))


def write_submission(run: Path, record: dict) -> None:
    (run / "submission.json").write_text(json.dumps(record))


def ddlaunch(*args: str, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, "DDLAUNCH_RUN_ROOT": str(root)},
    )


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_logs_follow_on_a_finished_run_prints_its_end_and_exits(tmp_path: Path) -> None:
    run = example_run_dir(tmp_path)
    (run / "logs" / "rank-0.out").write_text("[ddlaunch] starting from scratch\nstep 300\n")
    (run / "logs" / "rank-0.err").write_text("a warning\n")
    write_outcome(run, "COMPLETED", "finished all 300 steps")
    proc = ddlaunch("logs", "-f", "r", root=tmp_path)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (
        0,
        f"==> {run}/logs/rank-0.out <==\n[ddlaunch] starting from scratch\nstep 300\n"
        f"==> {run}/logs/rank-0.err <==\na warning\n",
        "[ddlaunch] run r: COMPLETED (finished all 300 steps)\n",
    )


def test_logs_follow_prints_a_header_at_every_switch_and_stops_at_the_final_state(
    tmp_path: Path,
) -> None:
    run = example_run_dir(tmp_path)
    out_log, err_log = run / "logs" / "rank-0.out", run / "logs" / "rank-0.err"
    out_log.write_text("out 1\n")
    err_log.write_text("err 1\n")
    proc = ddlaunch("logs", "-f", "r", root=tmp_path)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def expect(*wanted: str) -> None:
        for line in wanted:
            assert lines.get(timeout=20) == line + "\n"

    expect(f"==> {out_log} <==", "out 1", f"==> {err_log} <==", "err 1")
    append(err_log, "err 2\n")  # the same file as the last one printed: no header
    expect("err 2")
    append(out_log, "out 2\n")
    expect(f"==> {out_log} <==", "out 2")
    append(err_log, "Traceback: boom\n")
    expect(f"==> {err_log} <==", "Traceback: boom")
    write_outcome(run, "FAILED", "crash")
    assert proc.wait(timeout=20) == 1
    assert lines.empty()
    assert proc.stderr.read() == "[ddlaunch] run r: FAILED (crash)\n"  # type: ignore[union-attr]


def test_following_a_failed_run_ends_with_the_rank_that_failed(tmp_path: Path) -> None:
    """The ranks' output a follower prints often ends with a peer's error (rank 0's closed
    connection); the last lines name the rank that failed, as status and logs do."""
    run = example_run_dir(tmp_path)
    (run / "logs" / "rank-0.err").write_text("RuntimeError: Connection closed by peer\n")
    attempt = {"attempt": 0, "job_id": "5", "restart_count": 0, "start": 1.0, "end": 9.0}
    (run / "attempts.json").write_text(json.dumps([{**attempt, "cause": "crash"}]))
    (run / "failures").mkdir()
    failure = {"rank": 1, "host": "node1", "exception": "ValueError", "message": "boom"}
    failure |= {"where": "train.py:9", "job_id": "5", "attempt": 0, "time": 5.0}
    (run / "failures" / "rank-1.json").write_text(json.dumps(failure))
    write_outcome(run, "FAILED", "crash")
    proc = ddlaunch("logs", "-f", "r", root=tmp_path)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (
        1,
        "[ddlaunch] failed: rank 1 on node1: ValueError: boom at train.py:9\n"
        "[ddlaunch] run r: FAILED (crash)\n",
    )


def test_ctrl_c_detaches_without_cancelling(tmp_path: Path) -> None:
    run = example_run_dir(tmp_path)
    write_submission(run, {"job_ids": ["63"]})
    (run / "logs" / "rank-0.out").write_text("step 1\n")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "calls"
    for tool in ("squeue", "scancel", "sacct", "scontrol"):
        (fake_bin / tool).write_text(
            f'#!/bin/sh\necho {tool} "$@" >> {calls}\n'
            + ('echo "63|RUNNING|None|node1"\n' if tool == "squeue" else "")
        )
        (fake_bin / tool).chmod(0o755)
    env = {**ENV, "DDLAUNCH_RUN_ROOT": str(tmp_path), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", "logs", "-f", "r"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline() == f"==> {run}/logs/rank-0.out <==\n"  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while not calls.exists() and time.monotonic() < deadline:  # following: it asked squeue
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(2)  # SIGINT, as Ctrl-C
    assert proc.wait(timeout=20) == 130
    # The same file objects as readline's (communicate would skip what they buffered).
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    assert proc.returncode == 130
    assert out == "step 1\n"
    assert err == (
        "\n[ddlaunch] detached; run r goes on (ddlaunch logs -f r to follow it again, "
        "ddlaunch cancel to stop it)\n"
    )
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["squeue"]
    assert json.loads((run / "submission.json").read_text())["job_ids"] == ["63"]


def test_submit_local_streams_rank_0_with_the_loss_lines(tmp_path: Path) -> None:
    env = {
        **ENV,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad-nodes.json"),
    }
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "ddlaunch", "submit", "examples/mlp", "--local"),
            *("--set", "nodes.count=1", "--set", "params.steps=40", "--set", "params.log_every=20"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.split()[1]
    # Only what varies from run to run is replaced: the run id, the job id, the host, numbers.
    text = proc.stdout.replace(run_id, "RUN").replace(str(tmp_path), "TMP")
    for pattern, repl in (
        (r"local-[0-9a-f]{8}", "local-JOB"),
        (r"host \S+", "host HOST"),
        (r"\d+\.\d+", "N"),
        (r"[0-9a-f]{64}", "SHA"),
    ):
        text = re.sub(pattern, repl, text)
    assert text.splitlines() == [
        "run RUN",
        "run dir: TMP/runs/RUN  local, 2 ranks",
        "==> TMP/runs/RUN/logs/rank-0.out <==",
        "[ddlaunch] rank 0/2 local 0 host HOST job local-JOB attempt 0",
        "[ddlaunch] starting from scratch",
        "[mlp] step 20/40 loss N eval N",
        "[mlp] step 40/40 loss N eval N",
        "result: final_loss=N, initial_loss=N, param_sha256=SHA, start_step=0, steps=40, "
        "train_seconds=N, world_size=2",
        "completed in N s",
    ]
    assert proc.stderr == ""
