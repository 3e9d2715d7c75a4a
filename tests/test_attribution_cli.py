"""How ``status`` and ``logs`` tell which rank failed (#18 item 2), as a user reads them:
whole outputs of the real CLI (``NO_COLOR=1``, a pipe or an 80-column terminal), run
directories as the end hook leaves them. An attempt followed by another is history: the
run's headline is its final state, earlier failures are in the attempts cell and per
attempt. A rank that an in-process restart replaced is a line under its attempt, not the
run's failure."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.fakes import fake_slurm_bin
from support.rundirs import T0, make_run, write_attempts

from ddlaunch.store import components, outcome, standbys
from ddlaunch.store.failures import write_failure
from ddlaunch.store.standbys import TakenStandby, Tally

RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
KILLED = "rank 1 on node1 killed by SIGKILL"


def env_for(tmp_path: Path, squeue: str, columns: int = 80) -> dict[str, str]:
    bin_dir = fake_slurm_bin(tmp_path / "bin", squeue=squeue)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "NO_COLOR": "1",
        "COLUMNS": str(columns),
        "TZ": "UTC",
    }


def piped(tmp_path: Path, squeue: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        capture_output=True,
        text=True,
        env=env_for(tmp_path, squeue),
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def at_terminal(tmp_path: Path, squeue: str, columns: int, *args: str) -> str:
    leader, follower = pty.openpty()
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env_for(tmp_path, squeue, columns),
        check=False,
        timeout=60,
    )
    os.close(follower)
    out = os.read(leader, 65536).decode()
    os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return out.replace("\r\n", "\n")


def killed_attempt(**more: Any) -> dict[str, Any]:
    """Attempt 0 as the end hook closes it after rank 1 was killed (SIGKILL) and rank 2 raised
    a collateral error."""
    return {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "end": T0 + 60,
        "cause": "crash",
        "committed_step": 60,
        "resumed_from": None,
        "exit_code": 137,
        "ranks_ended": [{"rank": 1, "host": "node1", "signal": "SIGKILL"}],
        "causes": [
            {"rank": 1, "host": "node1", "kind": "killed", "text": KILLED, "source": "srun"},
            {
                "rank": 2,
                "host": "node2",
                "kind": "collateral",
                "text": f"rank 2 on node2: RuntimeError: {RESET} at mlp.py:80",
                "source": "failure record",
            },
        ],
        "culprit": KILLED,
        **more,
    }


def collateral_record(run: Path, restart: int = 0, when: float = T0 + 50) -> None:
    write_failure(
        run,
        2,
        {
            "rank": 2,
            "host": "node2",
            "exception": "RuntimeError",
            "message": RESET,
            "where": "mlp.py:80",
            "job_id": "377",
            "attempt": restart,
            "time": when,
            "traceback": "Traceback (most recent call last):\nRuntimeError: reset\n",
        },
    )


def completed_after_requeue(tmp_path: Path) -> Path:
    second = {
        "attempt": 1,
        "job_id": "377",
        "restart_count": 1,
        "nodes": "node[1-2]",
        "start": T0 + 70,
        "end": T0 + 130,
        "cause": "completed",
        "committed_step": 160,
        "resumed_from": 60,
        "exit_code": 0,
    }
    run = make_run(
        tmp_path / "runs",
        "r",
        "377",
        T0,
        attempts=[killed_attempt(), second],
        outcome=("COMPLETED", "completed"),
        ckpt=[160],
    )
    collateral_record(run)
    (run / "logs" / "rank-0.out").write_text("[mlp] step 160/160 loss 0.01\n")
    return run


COMPLETED_QUEUE = "377|COMPLETED|None|node[1-2]\n"


def test_a_run_completed_after_a_killed_rank_is_headlined_completed(tmp_path: Path) -> None:
    run = completed_after_requeue(tmp_path)
    attempt_lines = (
        "attempt 0: job 377 on node[1-2] at 14:13:20 60s, from scratch -> crash (committed 60): "
        "rank 1 on node1 killed by SIGKILL\n"
        "attempt 1: job 377 on node[1-2] at 14:14:30 60s, from step 60 -> completed "
        "(committed 160)\n"
    )
    # One run: a line per attempt follows the table, so the attempts cell is the count.
    one = (
        "run  job  state      nodes      step  ckpt  attempts\n"
        "r    377  COMPLETED  node[1-2]   160   160         2\n" + attempt_lines
    )
    assert piped(tmp_path, COMPLETED_QUEUE, "status", "r") == one
    # at a terminal each attempt wraps between words, its rest hanging under it
    assert at_terminal(tmp_path, COMPLETED_QUEUE, 80, "status", "r") == (
        "run  job  state      nodes      step  ckpt  attempts\n"
        "r    377  COMPLETED  node[1-2]   160   160         2\n"
        "attempt 0: job 377 on node[1-2] at 14:13:20 60s, from scratch -> crash\n"
        "    (committed 60): rank 1 on node1 killed by SIGKILL\n"
        "attempt 1: job 377 on node[1-2] at 14:14:30 60s, from step 60 -> completed\n"
        "    (committed 160)\n"
    )
    # Several runs: how earlier attempts failed is in the row; in a pipe the cell whole...
    make_run(tmp_path / "runs", "s", "378", T0 + 1, outcome=("COMPLETED", "completed"))
    queue = COMPLETED_QUEUE + "378|COMPLETED|None|node3\n"
    assert piped(tmp_path, queue, "status") == (
        "run  job  state      nodes      step  ckpt                                  attempts\n"
        "r    377  COMPLETED  node[1-2]   160   160  2 (0: rank 1 on node1 killed by SIGKILL)\n"
        "s    378  COMPLETED  node3         -     -                                         0\n"
    )
    # ...at a terminal the attempts cell keeps its count; how earlier attempts failed goes
    # under the row (docs/how-to/watch.md), at 60 columns as at 80.
    for width in (80, 60):
        assert at_terminal(tmp_path, queue, width, "status") == (
            "run  job  state      nodes      step  ckpt  attempts\n"
            "r    377  COMPLETED  node[1-2]   160   160         2\n"
            "  earlier 0: rank 1 on node1 killed by SIGKILL\n"
            "s    378  COMPLETED  node3         -     -         0\n"
        )
    logs = run / "logs"
    assert piped(tmp_path, COMPLETED_QUEUE, "logs", "r") == (
        "earlier: attempt 0 (job 377, crash): rank 1 on node1 killed by SIGKILL\n"
        f"==> {logs / 'rank-0.out'} <==\n"
        "[mlp] step 160/160 loss 0.01\n"
    )


def test_a_failed_run_is_headlined_by_its_killed_rank_not_the_collateral_error(
    tmp_path: Path,
) -> None:
    run = make_run(
        tmp_path / "runs",
        "r",
        "377",
        T0,
        attempts=[killed_attempt(decision="stopped: no progress")],
        outcome=("FAILED", "stopped: no progress"),
    )
    collateral_record(run)
    (run / "logs" / "rank-1.err").write_text("[rank 1] step 61\n")
    queue = "377|FAILED|None|node[1-2]\n"
    out = piped(tmp_path, queue, "status", "r")
    # What failed, then why no attempt followed (the decision); said once, above the table.
    assert out.splitlines()[:3] == [
        f"FAILED {KILLED}; stopped: no progress",
        "run  job  state   nodes      step  ckpt  attempts",
        "r    377  FAILED  node[1-2]     -     -         1",
    ]
    assert piped(tmp_path, queue, "logs", "r") == (
        f"FAILED {KILLED}\n==> {run / 'logs' / 'rank-1.err'} <==\n[rank 1] step 61\n"
    )


def test_a_long_headline_and_service_line_wrap_between_words_at_80_columns(
    tmp_path: Path,
) -> None:
    """The headline and a service's line wrap as the attempt lines do, at the terminal's
    width, their rest hanging under them; in a pipe each is one line."""
    stopped = "stopped: 2 requeues reached fault_tolerance.max_requeues=2"
    run = make_run(
        tmp_path / "runs",
        "r",
        "377",
        T0,
        attempts=[killed_attempt(decision=stopped)],
        outcome=("FAILED", stopped),
    )
    collateral_record(run)
    components.write(
        run,
        components.ServiceState(
            "tokenizer-service",
            components.STOPPED,
            4,
            -9,
            T0 + 60,
            reason=components.JOB_END,
            stop_signals=("TERM", "KILL"),
        ),
    )
    queue = "377|FAILED|None|node[1-2]\n"
    headline = f"FAILED {KILLED}; {stopped}"
    service = (
        "service tokenizer-service: stopped at the job's end (TERM, then KILL; restarted 3 "
        "times, last exit -9)"
    )
    out = piped(tmp_path, queue, "status", "r").splitlines()
    assert (out[0], out[-1]) == (headline, service)
    lines = at_terminal(tmp_path, queue, 80, "status", "r").splitlines()
    assert lines[:2] == [
        "FAILED rank 1 on node1 killed by SIGKILL; stopped: 2 requeues reached",
        "    fault_tolerance.max_requeues=2",
    ]
    assert lines[-2:] == [
        "service tokenizer-service: stopped at the job's end (TERM, then KILL; restarted",
        "    3 times, last exit -9)",
    ]
    assert max(len(line) for line in lines) <= 80


def test_a_run_running_again_after_a_requeue_has_no_failure_headline(tmp_path: Path) -> None:
    running = {
        "attempt": 1,
        "job_id": "377",
        "restart_count": 1,
        "nodes": "node[1-2]",
        "start": T0 + 70,
        "resumed_from": 60,
    }
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[killed_attempt(), running])
    collateral_record(run)
    out = piped(tmp_path, "377|RUNNING|None|node[1-2]\n", "status", "r")
    assert out.splitlines() == [
        "run  job  state    nodes      step  ckpt  attempts",
        "r    377  RUNNING  node[1-2]     -     -         2",
        "attempt 0: job 377 on node[1-2] at 14:13:20 60s, from scratch -> crash (committed 60): "
        "rank 1 on node1 killed by SIGKILL",
        "attempt 1: job 377 on node[1-2] at 14:14:30, from step 60 -> running",
    ]


def test_a_run_waiting_for_its_requeue_has_no_failure_headline(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[killed_attempt()])
    collateral_record(run)
    out = piped(tmp_path, "377|PENDING|BeginTime|\n", "status", "r")
    assert out.splitlines() == [
        "run  job  state    nodes      step  ckpt  attempts  note",
        "r    377  PENDING  node[1-2]     -     -         1  BeginTime",
        "attempt 0: job 377 on node[1-2] at 14:13:20 60s, from scratch -> crash (committed 60): "
        "rank 1 on node1 killed by SIGKILL",
    ]
    (run / "logs" / "rank-0.out").write_text("[mlp] step 60/160 loss 0.03\n")
    assert piped(tmp_path, "377|PENDING|BeginTime|\n", "logs", "r") == (
        "earlier: attempt 0 (job 377, crash): rank 1 on node1 killed by SIGKILL\n"
        f"==> {run / 'logs' / 'rank-0.out'} <==\n[mlp] step 60/160 loss 0.03\n"
    )


def test_records_without_attribution_say_the_collateral_error_is_a_peers(
    tmp_path: Path,
) -> None:
    """Attempt records written before the end hook attributed failures: the failure records
    are all there is, and a peer's error is said to be one."""
    old = {k: v for k, v in killed_attempt().items() if k not in ("causes", "culprit")}
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[old])
    collateral_record(run)
    out = piped(tmp_path, "377|FAILED|None|node[1-2]\n", "status", "r")
    assert out.splitlines()[0] == (
        f"FAILED rank 2 on node2: RuntimeError: {RESET} at mlp.py:80"
        " (a peer's error; the failing rank left no record)"
    )


def in_process_restart(**more: Any) -> dict[str, Any]:
    """Rank 3 on node2 crashed 30 s in; the standby pid 4242 on node2 took it, from its
    peer's copy in RAM of step 60, and the ranks formed their new group 1.8 s later."""
    return {
        "time": T0 + 30,
        "generation": 1,
        "ranks": [3],
        "hosts": ["node2"],
        "cause": "crash",
        "replacements": [{"rank": 3, "host": "node2", "pid": 4242}],
        "rejoined_s": 1.84,
        "resumed_from": 60,
        "state_from": "ram",
        "fell_back": None,
        **more,
    }


RECOVERED = (
    "  in-process restart 1: rank 3 on node2 crashed; standby pid 4242 took it; "
    "state from RAM (step 60); rejoined in 1.8 s"
)


def crashed_rank_record(run: Path, when: float) -> None:
    record = {"rank": 3, "host": "node2", "exception": "ValueError", "message": "bad batch"}
    write_failure(run, 3, {**record, "job_id": "377", "attempt": 0, "time": when})


def test_a_run_that_recovered_in_process_completed_with_each_restart_under_its_attempt(
    tmp_path: Path,
) -> None:
    """srun said 137 (the crashed rank's), the end hook took in_process_done for a
    completion: the run is COMPLETED with no failure headline, and the restart is a line
    under its attempt, in a pipe as at a terminal."""
    attempt = {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "end": T0 + 120,
        "cause": "completed",
        "committed_step": 160,
        "resumed_from": None,
        "exit_code": 137,
        "in_process_restarts": [in_process_restart()],
        "in_process_done": T0 + 119,
    }
    run = make_run(
        tmp_path / "runs",
        "r",
        "377",
        T0,
        attempts=[attempt],
        outcome=("COMPLETED", "completed"),
        ckpt=[160],
    )
    crashed_rank_record(run, T0 + 29)
    out = (
        "run  job  state      nodes      step  ckpt  attempts\n"
        "r    377  COMPLETED  node[1-2]   160   160         1\n"
        "attempt 0: job 377 on node[1-2] at 14:13:20 120s, from scratch -> completed "
        "(committed 160)\n" + RECOVERED + "\n"
    )
    assert piped(tmp_path, COMPLETED_QUEUE, "status", "r") == out
    assert at_terminal(tmp_path, COMPLETED_QUEUE, 80, "status", "r") == (
        "run  job  state      nodes      step  ckpt  attempts\n"
        "r    377  COMPLETED  node[1-2]   160   160         1\n"
        "attempt 0: job 377 on node[1-2] at 14:13:20 120s, from scratch -> completed\n"
        "    (committed 160)\n"
        "  in-process restart 1: rank 3 on node2 crashed; standby pid 4242 took it; state\n"
        "      from RAM (step 60); rejoined in 1.8 s\n"
    )


def test_a_running_run_shows_no_failure_its_ranks_recovered_from_in_process(
    tmp_path: Path,
) -> None:
    """The crashed rank's failure record is handled by the in-process restart after it: no
    FAILED headline while the ranks train on. A failure after the restart is news again,
    said with its verdict pending while the run runs (not yet the run's failure)."""
    attempt = {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "resumed_from": None,
        "in_process_restarts": [in_process_restart()],
    }
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[attempt])
    crashed_rank_record(run, T0 + 29)
    queue = "377|RUNNING|None|node[1-2]\n"
    # The step column agrees with the restart's note: the ranks resumed from step 60 in RAM.
    assert piped(tmp_path, queue, "status", "r").splitlines() == [
        "run  job  state    nodes      step  ckpt  attempts",
        "r    377  RUNNING  node[1-2]    60     -         1",
        "attempt 0: job 377 on node[1-2] at 14:13:20, from scratch -> running",
        RECOVERED,
    ]
    crashed_rank_record(run, T0 + 90)
    assert piped(tmp_path, queue, "status", "r").splitlines()[0] == (
        "RUNNING: rank 3 on node2 failed, verdict pending: ValueError: bad batch"
    )


def standby_books(run: Path, *events: tuple[str, ...]) -> None:
    """``standbys.json`` as the control store's holder writes it, from its events:
    ``("waiting", host)``, ``("spare", host)``, ``("took", host, rank, pid, rank_pid)``,
    ``("lost", host)``."""
    tally = Tally("377-0")
    for kind, host, *more in events:
        if kind in ("waiting", "spare"):
            tally.registered(host, spare=kind == "spare")
        elif kind == "took":
            rank, pid, rank_pid = map(int, more)
            tally.took(TakenStandby(rank, host, 1, pid, rank_pid))
        else:
            tally.lost_host(host)
    standbys.write(run, tally.book(T0 + 31))


def test_a_running_in_process_run_shows_its_standbys_under_the_attempt(tmp_path: Path) -> None:
    """standbys_per_node: 1 on two nodes; rank 3's standby on node2 took it (forking pid
    4250 for the rank) and waits again: two waiting, one taken. Once the attempt ended, its
    standbys are no more, and the line is gone."""
    attempt = {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "resumed_from": None,
        "in_process_restarts": [
            in_process_restart(
                replacements=[{"rank": 3, "host": "node2", "pid": 4242, "rank_pid": 4250}]
            )
        ],
    }
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[attempt])
    standby_books(
        run,
        ("waiting", "node1"),
        ("waiting", "node2"),
        ("took", "node2", "3", "4242", "4250"),
        ("waiting", "node2"),
    )
    queue = "377|RUNNING|None|node[1-2]\n"
    assert piped(tmp_path, queue, "status", "r") == (
        "run  job  state    nodes      step  ckpt  attempts\n"
        "r    377  RUNNING  node[1-2]    60     -         1\n"
        "attempt 0: job 377 on node[1-2] at 14:13:20, from scratch -> running\n"
        "  in-process restart 1: rank 3 on node2 crashed; standby pid 4242 took it, as pid "
        "4250; state from RAM (step 60); rejoined in 1.8 s\n"
        "  standbys: 2 waiting, 1 on each of node[1-2]; taken: rank 3 on node2 (in-process "
        "restart 1, pid 4250)\n"
    )
    ended = {**attempt, "end": T0 + 120, "cause": "completed", "committed_step": 160}
    write_attempts(run, [ended])
    outcome.write_outcome(run, "COMPLETED", "completed")
    shown = piped(tmp_path, COMPLETED_QUEUE, "status", "r")
    assert "standbys:" not in shown and "in-process restart 1" in shown, shown


def test_a_node_lost_with_its_standby_and_a_spares_standbys_that_took_its_ranks(
    tmp_path: Path,
) -> None:
    """Every process of node2 killed: its ranks moved to the spare node3, whose two standbys
    took them and wait again as node3's own; node2's standby is gone with it."""
    attempt = {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "resumed_from": None,
    }
    run = make_run(tmp_path / "runs", "r", "377", T0, attempts=[attempt])
    before = (("waiting", "node1"), ("waiting", "node2"), ("spare", "node3"), ("spare", "node3"))
    standby_books(run, *before)
    queue = "377|RUNNING|None|node[1-3]\n"
    lines = piped(tmp_path, queue, "status", "r").splitlines()
    assert lines[2:] == [
        "attempt 0: job 377 on node[1-2] at 14:13:20, from scratch -> running",
        "  standbys: 4 waiting, 1 on each of node[1-2], 2 on spare node3",
    ]
    standby_books(
        run,
        *before,
        ("lost", "node2"),
        ("took", "node3", "2", "31", "41"),
        ("took", "node3", "3", "32", "42"),
        ("waiting", "node3"),
        ("waiting", "node3"),
    )
    assert piped(tmp_path, queue, "status", "r").splitlines()[3] == (
        "  standbys: 3 waiting, 1 on node1, 2 on node3; node2 lost; taken: rank 2 on node3 "
        "(in-process restart 1, pid 41), rank 3 on node3 (in-process restart 1, pid 42)"
    )


def test_an_in_process_restart_that_fell_back_says_why_under_the_attempt_it_ended(
    tmp_path: Path,
) -> None:
    """No standby was left on node2: the ranks left, the attempt ended as a crash and the
    batch script restarted them in the allocation."""
    fell_back = in_process_restart(
        replacements=[],
        rejoined_s=None,
        resumed_from=None,
        state_from=None,
        fell_back="no standby left on node2 for rank 3",
    )
    first = {
        "attempt": 0,
        "job_id": "377",
        "restart_count": 0,
        "nodes": "node[1-2]",
        "start": T0,
        "end": T0 + 60,
        "cause": "crash",
        "committed_step": 60,
        "resumed_from": None,
        "exit_code": 1,
        "culprit": "rank 3 on node2: ValueError: bad batch",
        "in_process_restarts": [fell_back],
    }
    second = {
        "attempt": 1,
        "job_id": "377",
        "restart_count": 0,
        "relaunch": 1,
        "in_allocation": True,
        "nodes": "node[1-2]",
        "start": T0 + 70,
        "resumed_from": 60,
    }
    make_run(tmp_path / "runs", "r", "377", T0, attempts=[first, second])
    assert piped(tmp_path, "377|RUNNING|None|node[1-2]\n", "status", "r").splitlines()[2:] == [
        "attempt 0: job 377 on node[1-2] at 14:13:20 60s, from scratch -> crash (committed 60): "
        "rank 3 on node2: ValueError: bad batch",
        "  in-process restart 1: rank 3 on node2 crashed; fell back to ending the attempt: "
        "no standby left on node2 for rank 3",
        "attempt 1: job 377 (restart in the allocation) on node[1-2] at 14:14:30, "
        "from step 60 -> running",
    ]
