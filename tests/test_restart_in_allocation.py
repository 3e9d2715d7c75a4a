"""Restarting the ranks inside the allocation (pure and on disk, no Slurm): which endings
restart rather than requeue, the two caps and the progress guard together, the end hook's
exit code for the batch script, the start hook's record of a restart, a cancel between
restarts, and what tells one restart's attempt from another (records, ports, heartbeats,
failure records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.rundirs import attempt_json, committed_run, write_attempts

from ddlaunch.job import hooks
from ddlaunch.policy.heartbeats import current_beats
from ddlaunch.policy.requeue import Ending, History, RetryBudget, decide
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts
from ddlaunch.store.attempts import AttemptId, AttemptRecord
from ddlaunch.store.outcome import CANCEL_FILE
from ddlaunch.worker.distenv import from_environ, master_port_for

RESTARTS = "fault_tolerance.max_restarts"
REQUEUES = "fault_tolerance.max_requeues"


@pytest.mark.parametrize(
    ("cause", "blamed", "now", "resumed", "restarts", "requeues", "caps", "expected"),
    [
        # A crash that advanced restarts in the allocation while restarts are left...
        (
            "crash",
            (),
            40,
            None,
            0,
            0,
            (3, 3),
            (
                "restart",
                "restart in the allocation after crash: committed step none -> 40 (restart 1 of 3)",
            ),
        ),
        (
            "hang",
            (),
            60,
            40,
            2,
            0,
            (3, 0),
            (
                "restart",
                "restart in the allocation after hang: committed step 40 -> 60 (restart 3 of 3)",
            ),
        ),
        (
            "straggler",
            (),
            60,
            40,
            0,
            0,
            (1, 0),
            (
                "restart",
                "restart in the allocation after straggler: committed step 40 -> 60 "
                "(restart 1 of 1)",
            ),
        ),
        # ... then falls back to a requeue within its own cap ...
        (
            "crash",
            (),
            60,
            40,
            3,
            0,
            (3, 3),
            ("requeue", "requeue after crash: committed step 40 -> 60"),
        ),
        # ... and stops with both caps named when neither is left.
        (
            "crash",
            (),
            60,
            40,
            2,
            0,
            (2, 0),
            (
                "stop",
                f"stopped: 2 restarts in the allocation reached {RESTARTS}=2, "
                f"0 requeues reached {REQUEUES}=0",
            ),
        ),
        # max_restarts 0 (or a caller that cannot restart): today's requeue.
        (
            "crash",
            (),
            40,
            20,
            0,
            0,
            (0, 3),
            ("requeue", "requeue after crash: committed step 20 -> 40"),
        ),
        (
            "crash",
            (),
            40,
            20,
            0,
            3,
            (0, 3),
            ("stop", f"stopped: 3 requeues reached {REQUEUES}=3"),
        ),
        # The progress guard applies to a restart as to a requeue.
        (
            "crash",
            (),
            40,
            40,
            0,
            0,
            (3, 3),
            ("stop", "stopped: no progress in the last attempt (the committed step stayed at 40)"),
        ),
        (
            "crash",
            (),
            None,
            None,
            0,
            0,
            (3, 3),
            ("stop", "stopped: no progress in the last attempt (no checkpoint was ever committed)"),
        ),
        # A blamed node must be left out: only a requeue (a new allocation) can.
        (
            "hang",
            ("n2",),
            40,
            40,
            0,
            0,
            (3, 3),
            ("requeue", "requeue after hang: committed step 40 -> 40, without n2"),
        ),
        (
            "preflight",
            ("n2",),
            None,
            None,
            0,
            0,
            (3, 3),
            ("requeue", "requeue after preflight, without n2"),
        ),
        # A node failure ends the allocation; a signal means the time is up: requeues.
        (
            "node failure",
            (),
            40,
            20,
            0,
            0,
            (3, 3),
            ("requeue", "requeue after node failure: committed step 20 -> 40"),
        ),
        (
            "signal",
            (),
            120,
            100,
            0,
            0,
            (3, 3),
            ("requeue", "requeue after signal: committed step 100 -> 120"),
        ),
        ("completed", (), 300, 280, 0, 0, (3, 3), ("stop", "completed")),
        ("cancelled", (), 40, 20, 0, 0, (3, 3), ("stop", "cancelled by the user")),
    ],
)
def test_decide_restart_requeue_or_stop(
    cause, blamed, now, resumed, restarts, requeues, caps, expected
) -> None:
    d = decide(
        Ending(cause, now, blamed=tuple(blamed)),
        RetryBudget(caps[1], caps[0]),
        History(resumed, requeues, restarts),
    )
    kind = "restart" if d.restart else "requeue" if d.requeue else "stop"
    assert (kind, d.reason) == expected
    assert not (d.restart and d.requeue)


def test_restarts_and_requeues_are_counted_apart() -> None:
    records = [
        AttemptRecord(attempt=0),
        AttemptRecord(attempt=1, in_allocation=True, relaunch=1),
        AttemptRecord(attempt=2),  # a requeue: a new start of the job
        AttemptRecord(attempt=3, in_allocation=True, relaunch=1),
        AttemptRecord(attempt=4, in_allocation=True, relaunch=2),
    ]
    assert attempts.requeues(records) == 1
    assert attempts.restarts(records) == 3
    assert attempts.requeues(records[:1]) == 0 and attempts.restarts(records[:1]) == 0


def _run_with_open_attempt(tmp_path, committed, **record):  # type: ignore[no-untyped-def]
    run = committed_run(tmp_path, committed)
    base = {"attempt": 0, "job_id": "9", "restart_count": 0, "nodes": "node[1-2]"}
    write_attempts(run, [{**base, "resumed_from": None, **record}])
    return run


# Recorded from the dev cluster (trimmed): `scontrol show job -o 9` of a running job.
RUNNING_9 = "JobId=9 JobName=ft JobState=RUNNING Reason=None Restarts=0 BatchFlag=1"
HEALTHY = {"sinfo": "node1|allocated\nnode2|allocated\n", "scontrol show job": RUNNING_9}


def test_end_hook_asks_the_script_for_a_restart_and_never_requeues(tmp_path) -> None:
    run = _run_with_open_attempt(tmp_path, [20, 40])
    runner = FakeRunner(HEALTHY)
    code = hooks.end(run, 1, SlurmClient(runner), AttemptId("9", 0, "9"), can_restart=True)
    assert code == hooks.RESTART_EXIT
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    record = attempt_json(run)[0]
    assert record["cause"] == "crash" and record["committed_step"] == 40
    assert record["decision"] == (
        "restart in the allocation after crash: committed step none -> 40 (restart 1 of 3)"
    )
    assert not (run / "outcome.json").exists()


@pytest.mark.parametrize(
    "answer",
    [
        RUNNING_9.replace("Restarts=0", "Restarts=1"),  # someone requeued the job meanwhile
        CommandResult(
            ("scontrol",),
            1,
            "",
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        ),
    ],
    ids=["requeued meanwhile", "controller unreachable"],
)
def test_no_restart_without_the_controller_or_once_the_job_moved_on(tmp_path, answer) -> None:
    run = _run_with_open_attempt(tmp_path, [20, 40])
    runner = FakeRunner({**HEALTHY, "scontrol show job": answer})
    code = hooks.end(run, 1, SlurmClient(runner), AttemptId("9", 0, "9"), can_restart=True)
    assert code != hooks.RESTART_EXIT
    decision = attempt_json(run)[0]["decision"]
    assert decision.startswith("requeue after crash: committed step none -> 40"), decision


def test_end_hook_of_an_older_script_requeues_as_before(tmp_path) -> None:
    # A script rendered before restarts existed does not loop: it never passes --can-restart.
    run = _run_with_open_attempt(tmp_path, [20, 40])
    runner = FakeRunner(HEALTHY)
    assert hooks.end(run, 1, SlurmClient(runner), AttemptId("9", 0, "9")) == 0
    assert runner.calls[-1] == ["scontrol", "requeue", "9"]


def test_a_ranks_own_exit_75_does_not_read_as_a_restart(tmp_path) -> None:
    run = _run_with_open_attempt(tmp_path, [40], resumed_from=40)  # no progress: stop
    code = hooks.end(
        run, 75, SlurmClient(FakeRunner(HEALTHY)), AttemptId("9", 0, "9"), can_restart=True
    )
    assert code == 1
    assert json.loads((run / "outcome.json").read_text())["state"] == "FAILED"


def test_a_cancel_between_restarts_stops_for_good(tmp_path) -> None:
    run = _run_with_open_attempt(tmp_path, [20, 40])
    (run / CANCEL_FILE).write_text("{}")
    code = hooks.end(
        run, 1, SlurmClient(FakeRunner(HEALTHY)), AttemptId("9", 0, "9"), can_restart=True
    )
    assert code == 1
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["state"] == "CANCELLED"
    assert attempt_json(run)[0]["cause"] == "cancelled"


def test_restarts_used_up_fall_back_to_a_requeue(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40, 60])
    write_attempts(
        run,
        [
            {"attempt": 0, "job_id": "9", "resumed_from": None, "end": 1, "cause": "crash"},
            {
                "attempt": 1,
                "job_id": "9",
                "in_allocation": True,
                "relaunch": 1,
                "resumed_from": 40,
                "nodes": "node[1-2]",
            },
        ],
    )
    runner = FakeRunner(HEALTHY)
    settings = hooks.HookSettings(max_restarts=1, max_requeues=1)
    code = hooks.end(run, 1, SlurmClient(runner), AttemptId("9", 0, "9", 1), settings, True)
    assert code == 0 and runner.calls[-1] == ["scontrol", "requeue", "9"]
    assert attempt_json(run)[1]["decision"] == "requeue after crash: committed step 40 -> 60"


def test_start_hook_records_a_restart_in_the_allocation(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40])
    write_attempts(
        run,
        [
            {
                "attempt": 0,
                "job_id": "9",
                "restart_count": 0,
                "nodes": "node[1-2]",
                "resumed_from": None,
                "end": 5.0,
                "cause": "crash",
                "committed_step": 40,
            }
        ],
    )
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[1-2]", "DDLAUNCH_RELAUNCH": "1"}
    runner = FakeRunner({})
    attempt = AttemptId.from_env(env)
    hooks.start(run, SlurmClient(runner), attempt, env)
    first, second = attempt_json(run)
    assert first["cause"] == "crash"  # closed by its end hook: left as it was
    assert second == {
        **second,
        "attempt": 1,
        "job_id": "9",
        "restart_count": 0,
        "in_allocation": True,
        "relaunch": 1,
        "restart_cause": "crash",
        "resumed_from": 40,
    }
    assert attempt.matches(second) and not attempt.matches(first)
    assert runner.calls == []  # nothing to ask Slurm: the previous attempt was closed


def test_each_restart_is_its_own_attempt_for_files_ports_and_records() -> None:
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    first = AttemptId.from_env(env)
    again = AttemptId.from_env({**env, "DDLAUNCH_RELAUNCH": "2"})
    assert (first.key, again.key) == ("9-0", "9-0.2")
    assert AttemptRecord(job_id="9", restart_count=0, relaunch=2).key == "9-0.2"
    ports = {from_environ({**env, "DDLAUNCH_RELAUNCH": str(n)}).master_port for n in range(4)}
    assert len(ports) == 4  # a new MASTER_PORT per restart
    assert from_environ(env).master_port == master_port_for("9", 0)  # unchanged without one
    assert from_environ({**env, "DDLAUNCH_RELAUNCH": "1"}).relaunch == 1
    # The previous restart's heartbeats (same job, same Slurm restart count) are not this one's.
    beats = [
        {"rank": 0, "job_id": "9", "restart": 0, "relaunch": 0, "started": 10.0, "beat": 11.0},
        {"rank": 0, "job_id": "9", "restart": 0, "relaunch": 1, "started": 20.0, "beat": 21.0},
    ]
    assert [b.started for b in current_beats(beats, "9", 0, 0.0, 1)] == [20.0]
    assert [b.started for b in current_beats(beats, "9", 0, 0.0)] == [10.0]


def test_status_and_report_tell_a_restart_from_a_requeue() -> None:
    from types import SimpleNamespace

    from ddlaunch.app import report
    from ddlaunch.app.status import attempt_history
    from ddlaunch.cli.status import attempt_lines

    base = {"job_id": "9", "restart_count": 0, "nodes": "node[1-2]", "start": 0.0}
    records = [
        {**base, "attempt": 0, "end": 20.0, "cause": "crash", "committed_step": 60},
        {**base, "attempt": 1, "relaunch": 1, "in_allocation": True, "start": 21.0,
         "end": 70.0, "cause": "crash", "resumed_from": 60, "committed_step": 80},
        {**base, "attempt": 2, "restart_count": 1, "start": 90.0, "end": 130.0,
         "cause": "completed", "resumed_from": 80, "committed_step": 300},
    ]  # fmt: skip
    records = [AttemptRecord.from_json(r) for r in records]
    # Each restart's failure records are its own: attempt 1's rank 1, not attempt 0's.
    failures = [
        {"rank": 1, "host": "node1", "job_id": "9", "attempt": 0, "relaunch": relaunch,
         "exception": "RuntimeError", "message": f"in {relaunch}", "time": 10.0 + 50 * relaunch}
        for relaunch in (0, 1)
    ]  # fmt: skip
    from ddlaunch.store.failures import Failure

    records_of = [
        Failure(f["rank"], f["host"], f["exception"], f["message"], None, "9", 0,
                time=f["time"], relaunch=f["relaunch"])
        for f in failures
    ]  # fmt: skip
    info = SimpleNamespace(attempts=records, failures=records_of)
    history = attempt_history(info, "COMPLETED")  # type: ignore[arg-type]
    # Each attempt names its own failing rank (the same Slurm restart count for both).
    assert [h.get("culprit") for h in history] == [
        "rank 1 on node1: RuntimeError: in 0",
        "rank 1 on node1: RuntimeError: in 1",
        None,
    ]
    lines = [line.split(" at ")[0] for line in attempt_lines(SimpleNamespace(history=history))]
    assert lines == [
        "attempt 0: job 9 on node[1-2]",
        "attempt 1: job 9 (restart in the allocation) on node[1-2]",
        "attempt 2: job 9 on node[1-2]",  # a requeue: the same job, started again
    ]
    t = report.build("r", "COMPLETED", records, [], failures, [])
    assert [a.how for a in t.attempts] == ["9", "9 (restart in the allocation)", "9"]
    assert t.attempts[1].detail == "rank 1 on node1: RuntimeError: in 1"
    assert "9 (restart in the allocation)" in report.html_page(t, "")


def test_rank_0_names_the_attempt_as_status_does(tmp_path: Path) -> None:
    # After a restart inside the allocation Slurm's restart count is still 0; the run's
    # second attempt record is attempt 1, and rank 0's first line says so.
    from ddlaunch.worker.rank import _attempt_said

    first = attempts.new_record(0, AttemptId("9", 0, "9"), nodes="n1", host="n1", resumed_from=None)
    again = attempts.new_record(
        1, AttemptId("9", 0, "9", 1), nodes="n1", host="n1", resumed_from=20
    )
    write_attempts(tmp_path, [first, again])
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0", "DDLAUNCH_RELAUNCH": "1"}
    assert (_attempt_said(0, tmp_path, env), _attempt_said(1, tmp_path, env)) == (" attempt 1", "")


def test_rank_0_waits_for_its_own_attempts_record(tmp_path: Path) -> None:
    """The start hook opens the record beside the ranks' start: read too early, the record
    before named the attempt before (or none); rank 0 waits for its own."""
    import threading
    import time

    from ddlaunch.worker.rank import _attempt_said

    first = attempts.new_record(0, AttemptId("9", 0, "9"), nodes="n1", host="n1", resumed_from=None)
    again = attempts.new_record(
        1, AttemptId("9", 0, "9", 1), nodes="n1", host="n1", resumed_from=20
    )
    write_attempts(tmp_path, [first])
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0", "DDLAUNCH_RELAUNCH": "1"}
    opener = threading.Timer(0.3, write_attempts, (tmp_path, [first, again]))
    opener.start()
    began = time.monotonic()
    assert _attempt_said(0, tmp_path, env) == " attempt 1"
    assert 0.2 < time.monotonic() - began < 4
    opener.join()
    # No record of its own within the wait: no attempt named; a local run's is there before.
    write_attempts(tmp_path, [first])
    assert _attempt_said(0, tmp_path, env, wait_s=0.3) == ""
    local = attempts.new_record(0, AttemptId("", 0), nodes="h", host="h", resumed_from=None)
    write_attempts(tmp_path, [local])
    assert _attempt_said(0, tmp_path, {}) == " attempt 0"
