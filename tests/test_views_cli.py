"""Whole outputs of the views a new user reads first, piped and at a terminal of 80 columns
(``NO_COLOR=1``, ``TZ=UTC``, a run root of the test's own), against recorded Slurm output
replayed by stand-in commands on PATH (``support.fakes.fake_slurm_bin``)."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

from support.fakes import fake_slurm_bin, slurm_calls
from support.rundirs import RUN_CONFIG, T0, make_run, started_sweep

from ddlaunch.app.doctor import Row
from ddlaunch.cli.doctor import table as doctor_table


def env_for(tmp_path: Path, **slurm: str) -> dict[str, str]:
    bin_dir = fake_slurm_bin(tmp_path / "bin", **slurm)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad_nodes.json"),
        "SLURM_CONF": str(tmp_path / "no-slurm.conf"),
        "NO_COLOR": "1",
        "COLUMNS": "80",
        "TZ": "UTC",
    }


def piped(tmp_path: Path, *args: str, **slurm: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        capture_output=True,
        text=True,
        env=env_for(tmp_path, **slurm),
        cwd=tmp_path,
        check=False,
        timeout=60,
    )


def at_terminal(tmp_path: Path, *args: str, **slurm: str) -> tuple[int, str]:
    """The exit status and what a terminal of 80 columns shows (stdout on a pty)."""
    leader, follower = pty.openpty()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env_for(tmp_path, **slurm),
        cwd=tmp_path,
        check=False,
        timeout=60,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.returncode, b"".join(chunks).decode().replace("\r\n", "\n")


def _long_sweep(tmp_path: Path) -> Path:
    sweep = started_sweep(tmp_path / "runs", "lr", ["0.01 params.batch_size=32", "0.1"])
    (sweep / "members" / "0" / "result.json").write_text(json.dumps({"final_loss": 0.04217}))
    return sweep


QUEUE = "900_0|COMPLETED|None|node1\n900_1|RUNNING|None|node2\n"


def test_sweep_status_in_a_pipe_is_one_member_per_line(tmp_path: Path) -> None:
    _long_sweep(tmp_path)
    proc = piped(tmp_path, "sweep", "status", "lr", squeue=QUEUE)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout.splitlines() == [
        "#  overrides                            job    state      step  ckpt  attempts  "
        "final_loss",
        "0  params.lr=0.01 params.batch_size=32  900_0  COMPLETED     -     -         1  "
        "   0.04217",
        "1  params.lr=0.1                        900_1  RUNNING       -     -         1  "
        "         -",
        "2 members: 1 COMPLETED, 1 RUNNING",
    ]


def test_sweep_status_at_80_columns_moves_counts_under_the_row(tmp_path: Path) -> None:
    _long_sweep(tmp_path)
    code, out = at_terminal(tmp_path, "sweep", "status", "lr", squeue=QUEUE)
    assert code == 0
    assert out == (
        "#  overrides                            job    state      step  ckpt  final_loss\n"
        "0  params.lr=0.01 params.batch_size=32  900_0  COMPLETED     -     -     0.04217\n"
        "  attempts 1\n"
        "1  params.lr=0.1                        900_1  RUNNING       -     -           -\n"
        "  attempts 1\n"
        "2 members: 1 COMPLETED, 1 RUNNING\n"
    )


def _bad_nodes(tmp_path: Path) -> None:
    entry = {
        "node": "gpu-node-017",
        "reason": "rank 3 hung in all_reduce for 600 s (heartbeat analysis of run mlp-2026)",
        "added": T0,
        "expires": None,
        "source": "run mlp-example-20261201-120000-a1b2",
    }
    (tmp_path / "bad_nodes.json").write_text(json.dumps([entry]))


def test_nodes_in_a_pipe_and_at_80_columns(tmp_path: Path) -> None:
    _bad_nodes(tmp_path)
    proc = piped(tmp_path, "nodes")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        "node          expires  added             source                                reason",
        "gpu-node-017  never    2026-09-21 14:13  run mlp-example-20261201-120000-a1b2  "
        "rank 3 hung in all_reduce for 600 s (heartbeat analysis of run mlp-2026)",
    ]
    code, out = at_terminal(tmp_path, "nodes")
    assert code == 0
    assert out == (
        "node          expires  added             source\n"
        "gpu-node-017  never    2026-09-21 14:13  run mlp-example-20261201-120000-a1b2\n"
        "  rank 3 hung in all_reduce for 600 s (heartbeat analysis of run mlp-2026)\n"
    )


def _doctor_rows() -> list[Row]:
    checks = {
        "gpus": "8 listed",
        "torch": "2.5.1+cu124",
        "bandwidth": "ring 92.1 GB/s",
        "disk:/scratch": "ok: 812 GB free",
        "disk:/tmp": "ok: 40 GB free",
    }
    fabric = ["rdma.mlx5_0: mismatch (port down)", "fabric.kind: warning (declare it)"]
    return [
        Row("gpu-node-017", "MISMATCH", checks, fabric, []),
        Row("gpu-node-018", "ok", checks, [], []),
    ]


def test_doctor_table_in_a_pipe_and_at_80_columns() -> None:
    # The table the verb prints after its job (which a unit test does not submit).
    assert doctor_table(_doctor_rows(), None).splitlines() == [
        "node          verdict   gpus      torch        bandwidth       "
        "disk                                     fabric",
        "gpu-node-017  MISMATCH  8 listed  2.5.1+cu124  ring 92.1 GB/s  "
        "/scratch: 812 GB free; /tmp: 40 GB free  "
        "rdma.mlx5_0: mismatch (port down); fabric.kind: warning (declare it)",
        "gpu-node-018  ok        8 listed  2.5.1+cu124  ring 92.1 GB/s  "
        "/scratch: 812 GB free; /tmp: 40 GB free",
    ]
    assert doctor_table(_doctor_rows(), 80).splitlines() == [
        "node          verdict   gpus      torch        bandwidth",
        "gpu-node-017  MISMATCH  8 listed  2.5.1+cu124  ring 92.1 GB/s",
        "  disk /scratch: 812 GB free; /tmp: 40 GB free; rdma.mlx5_0: mismatch (port",
        "  down); fabric.kind: warning (declare it)",
        "gpu-node-018  ok        8 listed  2.5.1+cu124  ring 92.1 GB/s",
        "  disk /scratch: 812 GB free; /tmp: 40 GB free",
    ]


def test_sweep_help_shows_whole_subcommand_lines_at_80_columns(tmp_path: Path) -> None:
    proc = piped(tmp_path, "sweep", "--help")
    assert proc.returncode == 0, proc.stderr
    commands = proc.stdout[proc.stdout.index("Commands:") :]
    assert commands == (
        "Commands:\n"
        "  cancel    Cancel every member of SWEEP that has not ended (all its arrays):\n"
        "            the same as `ddlaunch cancel SWEEP`.\n"
        "  resubmit  Submit members again, as a new array, each in its own run\n"
        "            directory and from its own latest complete checkpoint.\n"
        "  status    One row per member (overrides, state, step, checkpoint, metric)\n"
        "            and a summary line.\n"
        "  submit    Expand FILE, validate every member, write the sweep directory\n"
        "            (every member's resolved config in members.json) and submit the\n"
        "            members as job arrays (one, unless the cluster's MaxArraySize\n"
        "            forces a split).\n"
    )


def test_no_group_cuts_a_help_line_at_80_columns(tmp_path: Path) -> None:
    for group in ([], ["sweep"], ["nodes"]):
        proc = piped(tmp_path, *group, "--help")
        assert proc.returncode == 0, proc.stderr
        cut = [
            line
            for line in proc.stdout.splitlines()
            if line.endswith("...") and not line.startswith("Usage:")
        ]
        wide = [line for line in proc.stdout.splitlines() if len(line) > 80]
        assert (group, cut, wide) == (group, [], [])


def test_cancel_of_a_pending_job_waits_for_it_to_leave_the_queue(tmp_path: Path) -> None:
    make_run(tmp_path / "runs", "r", "383", T0)
    env = env_for(tmp_path, squeue="383|PENDING|Priority|\n")
    fake_slurm_bin(tmp_path / "bin", after_scancel={"squeue": ""}, squeue="383|PENDING|Priority|\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "cancel", "r"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (0, "waiting for job 383 to leave the queue...\n")
    assert proc.stdout == "r: cancelled job 383: cancelled before it started\n"


def _cancel_waiting(tmp_path: Path, run: str, job: str) -> subprocess.Popen[str]:
    """``ddlaunch cancel RUN`` against a job that keeps running after scancel (its ranks
    save), so cancel waits: started, its lines to be read."""
    env = env_for(tmp_path, squeue=f"{job}|RUNNING|None|node1\n")
    return subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", "cancel", run],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_cancel_of_a_trainer_that_saves_on_no_sigterm_says_its_last_checkpoint_is_kept(
    tmp_path: Path,
) -> None:
    """Lightning saves on USR1 (its Slurm requeue), DeepSpeed on no signal: the cancel's
    SIGTERM ends them without a save, and the wait must not say the ranks save first."""
    lightning = "trainer:\n  kind: lightning\nlaunch:\n  script: train.py\n"
    make_run(
        tmp_path / "runs", "pl", "385", T0, attempts=[{"attempt": 0, "start": T0}],
        config=RUN_CONFIG + lightning,
    )  # fmt: skip
    proc = _cancel_waiting(tmp_path, "pl", "385")
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline() == (
            "waiting for job 385 to stop (its trainer saves on no cancel: its last checkpoint "
            "is kept)...\n"
        )
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_ctrl_c_during_cancel_s_wait_says_the_job_was_cancelled(tmp_path: Path) -> None:
    make_run(tmp_path / "runs", "r", "384", T0, attempts=[{"attempt": 0, "start": T0}])
    proc = _cancel_waiting(tmp_path, "r", "384")
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline() == "waiting for job 384 to stop (the ranks save first)...\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (130, "")
    # (the blank line is click's: it ends the terminal's echo of ^C)
    assert err == "\ninterrupted (SIGINT): job 384 was cancelled; not waiting for it to stop\n"
    assert "scancel 384" in slurm_calls(tmp_path / "bin")


def test_watch_says_the_interval_floor_once_and_stops_when_the_named_runs_ended(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    make_run(root, "ok", "390", T0, outcome=("COMPLETED", "finished step 300"))
    make_run(root, "bad", "391", T0 + 1, outcome=("FAILED", "rank 1 exited 1"))
    floor = "--interval 5 is below the floor of 30 s ($DDLAUNCH_MIN_POLL_S): polling every 30 s\n"
    stopped = "every run named has ended; stopped watching\n"
    proc = piped(tmp_path, "status", "--watch", "--interval", "5", "ok")
    assert (proc.returncode, proc.stderr) == (0, floor + stopped)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("polled ") and lines[0].endswith(", every 30 s (Ctrl-C to stop)")
    assert lines[1:] == [
        "run  job  state      nodes  step  ckpt  attempts  note",
        "ok   390  COMPLETED  -         -     -         0  finished step 300",
    ]
    proc = piped(tmp_path, "status", "--watch", "ok", "bad")
    assert (proc.returncode, proc.stderr) == (1, stopped)
    assert proc.stdout.splitlines()[1:] == [
        "run  job  state      nodes  step  ckpt  attempts  note",
        "ok   390  COMPLETED  -         -     -         0  finished step 300",
        "bad  391  FAILED     -         -     -         0  rank 1 exited 1",
    ]


def _two_runs(tmp_path: Path) -> str:
    root = tmp_path / "runs"
    history = [
        {
            "attempt": 0,
            "start": T0,
            "end": T0 + 60,
            "cause": "node_fail",
            "culprit": "rank 1 on node1 killed by SIGKILL",
            "job_id": "383",
        },
        {"attempt": 1, "start": T0 + 70, "job_id": "384"},
    ]
    make_run(root, "user-llama-8b-20261202-051122-3380", "384", T0, attempts=history)
    make_run(root, "vit-20261202-051122-3788", "385", T0 + 1)
    return "384|RUNNING|None|node[2-3]\n385|RUNNING|None|node4\n"


def test_status_at_80_columns_moves_earlier_failures_under_the_row(tmp_path: Path) -> None:
    queue = _two_runs(tmp_path)
    code, out = at_terminal(tmp_path, "status", squeue=queue)
    assert code == 0
    # the id keeps as much of itself as the row leaves once the failures moved under it
    assert out == (
        "run                                job  state    nodes      step  ckpt  attempts\n"
        "user-llama-8b-20261202-05112…3380  384  RUNNING  node[2-3]     -     -         2\n"
        "  earlier 0: rank 1 on node1 killed by SIGKILL\n"
        "vit-20261202-051122-3788           385  RUNNING  node4         -     -         0\n"
    )
    # a pipe keeps one row per line, the attempts cell whole
    proc = piped(tmp_path, "status", squeue=queue)
    assert proc.stdout.splitlines()[1] == (
        "user-llama-8b-20261202-051122-3380  384  RUNNING  node[2-3]     -     -  "
        "2 (0: rank 1 on node1 killed by SIGKILL)"
    )


def test_a_shortened_run_id_is_accepted_back(tmp_path: Path) -> None:
    queue = _two_runs(tmp_path)
    proc = piped(tmp_path, "status", "--json", "u…3380", squeue=queue)
    assert proc.returncode == 0, proc.stderr
    assert [r["run_id"] for r in json.loads(proc.stdout)] == ["user-llama-8b-20261202-051122-3380"]
    # the ellipsis stands for at least one character, and head and tail must both match
    proc = piped(tmp_path, "status", "u…3788", squeue=queue)
    assert proc.returncode == 2
    root = tmp_path / "runs"
    assert proc.stderr == (
        f"error: no run 'u…3788' (looked for a run directory at that path and under {root}; "
        "set DDLAUNCH_RUN_ROOT or pass the run directory)\n"
    )
