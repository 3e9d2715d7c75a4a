"""Failure attribution (#18 item 2): srun's and slurmstepd's lines parsed from real batch logs
of the dev cluster (``tests/fixtures/slurm-22.05/``), the ranking of causes over every
combination of killed, crashed, raised, collateral and teardown ranks, and the end hook's
record of a crashed attempt."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.rundirs import attempt_json, committed_run, write_attempts

from ddlaunch.job import attribution as collect
from ddlaunch.job import hooks
from ddlaunch.policy import attribution as policy
from ddlaunch.policy.attribution import Raised, StepLog, TaskEnd, rank_causes
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.attempts import AttemptId

FIXTURES = Path(__file__).parent / "fixtures" / "slurm-22.05"
FIXTURES_26 = Path(__file__).parent / "fixtures" / "slurm-26.05"
RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
# A peer's error as gloo raised it on the dev cluster (job 1550).
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [10.77.0.11]:63116. This is typically caused by a remote worker crashing. Check the "
    "logs of the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def step_part(step: int) -> str:
    """One srun step's part of the recorded batch log (``srun-deaths.sbatch`` echoes a
    ``== step N`` line before each)."""
    text = fixture("srun-deaths.out")
    start = text.index(f"== step {step}")
    end = text.find(f"== step {step + 1}")
    return text[start : end if end >= 0 else None]


# ------------------------------------------------------------------ parsing real output


def test_every_way_a_task_ends_as_srun_22_05_reports_it() -> None:
    """Six tasks ending six ways, srun without --kill-on-bad-exit (recorded)."""
    log = policy.parse_step_log(step_part(0))
    ends = {e.rank: e for e in log.ends}
    assert sorted(ends) == [1, 2, 3, 4, 5]  # task 0 exited 0: srun says nothing of it
    assert (ends[1].host, ends[1].signal, ends[1].exit_code) == ("node1", "SIGKILL", None)
    assert (ends[2].host, ends[2].signal, ends[2].exit_code) == ("node1", None, 2)
    assert (ends[3].host, ends[3].signal) == ("node2", "SIGSEGV")
    assert (ends[4].host, ends[4].signal) == ("node2", "SIGABRT")
    assert (ends[5].host, ends[5].signal) == ("node2", "SIGTERM")
    assert [e.rank for e in log.ends] == [1, 2, 3, 4, 5]  # the order they ended in
    assert not any(e.teardown for e in log.ends)
    assert [c.text for c in rank_causes(log, [])] == [
        "rank 1 on node1 killed by SIGKILL",
        "rank 2 on node1 exited with exit code 2 without a Python exception",
        *(f"rank {r} on node2 killed by {s}" for r, s in ((3, "SIGSEGV"), (4, "SIGABRT"))),
        "rank 5 on node2 killed by SIGTERM",
    ]


@pytest.mark.parametrize(
    ("step", "cause"),
    [
        (1, "rank 1 on node1 killed by SIGKILL"),
        (2, "rank 2 on node1 exited with exit code 3 without a Python exception"),
    ],
)
def test_kill_on_bad_exit_the_first_task_is_the_cause_the_rest_teardown(
    step: int, cause: str
) -> None:
    """srun --kill-on-bad-exit=1 terminates the other 5 tasks (SIGTERM) once one fails."""
    log = policy.parse_step_log(step_part(step))
    first, *rest = log.ends
    assert not first.teardown
    assert sorted(e.rank for e in rest) == sorted({0, 1, 2, 3, 4, 5} - {first.rank})
    assert all(e.teardown and e.signal == "SIGTERM" for e in rest), log.ends
    assert log.cancelled == f"1545.{step} ON node1 CANCELLED AT 2026-12-01T12:05:4{step}"
    causes = rank_causes(log, [])
    assert causes[0].text == cause
    assert {c.kind for c in causes[1:]} == {policy.TEARDOWN}
    assert causes[1].text.endswith("killed by SIGTERM (the step's teardown)")


def test_the_whole_recorded_log_keeps_each_ranks_first_report() -> None:
    ends = policy.parse_step_log(fixture("srun-deaths.out")).ends
    assert [(e.rank, e.signal or e.exit_code) for e in ends] == [
        (1, "SIGKILL"),
        (2, 2),
        (3, "SIGSEGV"),
        (4, "SIGABRT"),
        (5, "SIGTERM"),
        (0, "SIGTERM"),
    ]


def test_sacct_steps_of_the_recorded_job() -> None:
    """sacct keeps a step's worst ``code:signal``: after --kill-on-bad-exit it is the
    teardown's SIGTERM (steps 1 and 2), not the SIGKILL or exit 3 that started it."""
    steps = policy.parse_sacct_steps(fixture("sacct-steps.txt"))
    assert [(s.step, s.state, s.exit_code, s.signal) for s in steps] == [
        ("1545.0", "CANCELLED", 0, 11),
        ("1545.1", "CANCELLED", 0, 15),
        ("1545.2", "CANCELLED", 0, 15),
    ]
    cause = policy.from_accounting(steps)
    assert cause is not None and cause.kind == policy.TEARDOWN and cause.rank is None
    assert cause.text == (
        "step 1545.2 on node[1-2] cancelled (sacct: SIGTERM; which rank failed first unknown)"
    )


# ------------------------------------------------------------------ hand-made lines


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("srun: error: node3: tasks 4-5,7: Killed", [(r, "SIGKILL") for r in (4, 5, 7)]),
        ("srun: error: node2: task 0: Segmentation fault (core dumped)", [(0, "SIGSEGV")]),
        ("srun: error: node2: task 6: Bus error", [(6, "SIGBUS")]),
        ("srun: error: node1: task 3: Exited with exit code 137", [(3, None)]),
        ("srun: error: gpu-a17: task 12: Out Of Memory", [(12, None)]),
    ],
)
def test_task_report_forms(line: str, expected: list[tuple[int, str | None]]) -> None:
    ends = policy.parse_step_log(line).ends
    assert [(e.rank, e.signal) for e in ends] == expected


def test_oom_exit_codes_and_cores_in_words() -> None:
    ends = policy.parse_step_log(
        "srun: error: gpu-a17: task 12: Out Of Memory\n"
        "srun: error: node1: task 3: Exited with exit code 137\n"
        "srun: error: node2: task 0: Segmentation fault (core dumped)\n"
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=5.0. Some of your "
        "processes may have been killed by the cgroup out-of-memory handler.\n"
    )
    assert [f"rank {e.rank} on {e.host} {e.how()}" for e in ends.ends] == [
        "rank 12 on gpu-a17 killed by the out-of-memory killer",
        "rank 3 on node1 exited with exit code 137 without a Python exception "
        "(= 128 + SIGKILL: a wrapper's child was killed?)",
        "rank 0 on node2 killed by SIGSEGV (core dumped)",
    ]
    assert ends.oom_events == 1


def test_a_rank_whose_program_never_ran_says_why() -> None:
    # Recorded on the 22.05 dev cluster (`srun -N1 -n2 /nonexistent/apptainer exec x`): the
    # container runtime missing on the node, as a job with container.runtime: apptainer
    # ends where the nodes have no apptainer.
    log = policy.parse_step_log(
        "slurmstepd-node1: error: execve(): /nonexistent/apptainer: No such file or directory\n"
        "slurmstepd-node1: error: execve(): /nonexistent/apptainer: No such file or directory\n"
        "srun: error: node1: tasks 0-1: Exited with exit code 2\n"
        "srun: error: node2: task 2: Exited with exit code 2\n"
    )
    assert [f"rank {e.rank} on {e.host} {e.how()}" for e in log.ends] == [
        "rank 0 on node1 could not start (execve(): /nonexistent/apptainer: No such file or "
        "directory)",
        "rank 1 on node1 could not start (execve(): /nonexistent/apptainer: No such file or "
        "directory)",
        "rank 2 on node2 exited with exit code 2 without a Python exception",
    ]
    causes = policy.rank_causes(log, [])
    assert causes[0].text == (
        "rank 0 on node1 could not start (execve(): /nonexistent/apptainer: No such file or "
        "directory)"
    )


# slurmstepd's notes of a step whose program never ran, in each form: 22.05's (the cancel from
# srun-deaths.out, the execve() line of the test above, both recorded on the dev cluster) and
# 26.05's (both lines of tests/fixtures/slurm-26.05/stepd-task-failure.txt). Each: the
# execve() line, the cancel, the node and the program's error as the user must read it.
STEPD_22 = (
    "slurmstepd-node1: error: execve(): /nonexistent/apptainer: No such file or directory",
    next(line for line in fixture("srun-deaths.out").splitlines() if "*** STEP" in line),
)
STEPD_26 = tuple(
    next(
        line
        for line in (FIXTURES_26 / "stepd-task-failure.txt").read_text().splitlines()
        if k in line
    )
    for k in ("execve()", "*** STEP")
)
STEPD_FORMS = [
    pytest.param(
        STEPD_22,
        "node1",
        "execve(): /nonexistent/apptainer: No such file or directory",
        "1545.1 ON node1 CANCELLED AT 2026-12-01T12:05:41",
        id="22.05",
    ),
    pytest.param(
        STEPD_26,
        "node",
        "execve(): /nonexistent/python: No such file or directory",
        "15.1 ON node CANCELLED AT 2026-12-07T08:23:33 DUE TO TASK FAILURE",
        id="26.05",
    ),
]


@pytest.mark.parametrize(("stepd", "host", "execve", "cancelled"), STEPD_FORMS)
def test_slurmstepd_lines_are_read_in_either_form(
    stepd: tuple[str, str], host: str, execve: str, cancelled: str
) -> None:
    """#48: 26.05 dropped the ``slurmstepd-NODE:`` prefix for ``[timestamp] error:``. The
    lines in the order their timestamps give (execve() first), srun's report between them in
    the shape recorded on 22.05."""
    failed, cancel = stepd
    log = policy.parse_step_log(
        f"{failed}\nsrun: error: {host}: task 0: Exited with exit code 2\n{cancel}\n"
    )
    assert log.cancelled == cancelled
    assert [c.text for c in policy.rank_causes(log, [])] == [
        f"rank 0 on {host} could not start ({execve})"
    ]


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param("slurmstepd: error: ", id="22.05"),
        # 26.05's prefix (the recorded lines') before the message 22.05 prints: composed, no
        # OOM was provoked on 26.05 to record one.
        pytest.param("[2026-12-07T08:23:33.640] error: ", id="26.05"),
    ],
)
def test_the_oom_events_are_counted_in_either_form(prefix: str) -> None:
    message = (
        "Detected 1 oom-kill event(s) in StepId=5.0. Some of your processes may have been "
        "killed by the cgroup out-of-memory handler."
    )
    assert policy.parse_step_log(f"{prefix}{message}\n").oom_events == 1


@pytest.mark.parametrize(
    "line",
    [
        # A rank's own lines that say "error:" around slurmstepd's words: none is its note.
        "[rank0]: error: execve(): /nonexistent/python: No such file or directory",
        "INFO [2026-12-07T08:23:33.612] error: execve(): /bin/x: No such file or directory",
        "[2026-12-07T08:23:33.612] error: CUDA error: out of memory",
        "[2026-12-07 08:23:33] error: *** STEP 15.1 ON node CANCELLED AT 2026-12-07T08:23:33 ***",
        "[2026-12-07T08:23:33.612] warning: Detected 3 oom-kill event(s) in StepId=5.0.",
    ],
)
def test_a_ranks_own_error_line_is_not_taken_for_slurmstepds(line: str) -> None:
    log = policy.parse_step_log(f"{line}\nsrun: error: node: task 0: Exited with exit code 2\n")
    assert (log.cancelled, log.oom_events) == (None, 0)
    assert [e.how() for e in log.ends] == ["exited with exit code 2 without a Python exception"]
    assert policy.stderr_not_started(line) is None


def test_a_line_that_names_no_node_is_given_only_to_the_tasks_it_can_be() -> None:
    """One 26.05 execve() line (one task never ran) and two exits with code 2: which of the
    two never ran the batch log cannot tell, so neither is said to have."""
    failed = STEPD_26[0]
    log = policy.parse_step_log(
        f"{failed}\nsrun: error: node1: task 0: Exited with exit code 2\n"
        "srun: error: node2: task 1: Exited with exit code 2\n"
    )
    assert [e.not_started for e in log.ends] == [None, None]
    both = policy.parse_step_log(
        f"{failed}\n{failed}\nsrun: error: node: tasks 0-1: Exited with exit code 2\n"
    )
    assert [e.not_started for e in both.ends] == [
        "execve(): /nonexistent/python: No such file or directory"
    ] * 2


# ------------------------------------------------------------------ ranking combinatorics

KINDS = ("killed", "crashed", "raised", "collateral", "teardown")


def _evidence(present: tuple[str, ...], order: tuple[str, ...]) -> tuple[StepLog, list[Raised]]:
    """One rank per kind present (rank = its index in KINDS), srun lines in ``order``."""
    ends, raised = [], []
    for n, kind in enumerate(order):
        if kind not in present:
            continue
        rank = KINDS.index(kind)
        host = f"node{rank}"
        if kind == "killed":
            ends.append(TaskEnd(rank, host, signal="SIGKILL", order=n))
        elif kind == "crashed":
            ends.append(TaskEnd(rank, host, exit_code=3, order=n))
        elif kind == "teardown":
            ends.append(TaskEnd(rank, host, signal="SIGKILL", order=n, teardown=True))
        else:  # a raising rank exits 1: srun reports it too, the record says more
            ends.append(TaskEnd(rank, host, exit_code=1, order=n))
            message = RESET if kind == "collateral" else "boom"
            raised.append(Raised(rank, host, "RuntimeError", message, "t.py:1", time=float(n)))
    return StepLog(tuple(ends)), raised


COMBINATIONS = [
    (present, order)
    for size in range(1, len(KINDS) + 1)
    for present in itertools.combinations(KINDS, size)
    for order in itertools.permutations(present)
]


@pytest.mark.parametrize(("present", "order"), COMBINATIONS)
def test_the_cause_comes_first_in_every_combination(
    present: tuple[str, ...], order: tuple[str, ...]
) -> None:
    log, raised = _evidence(present, order)
    causes = rank_causes(log, raised)
    assert sorted(c.rank for c in causes) == sorted(KINDS.index(k) for k in present)
    kinds = [c.kind for c in causes]
    tier = [policy.TIERS[k] for k in kinds]
    assert tier == sorted(tier), kinds  # killed|crashed < raised < collateral < teardown
    silent = [k for k in order if k in ("killed", "crashed")]
    if silent:  # the first of them to end is the cause
        assert kinds[0] == silent[0]
    elif "raised" in present:
        assert kinds[0] == "raised"
    elif "collateral" in present and "teardown" in present:
        # The peer the collateral error lost: the one rank killed in the teardown.
        assert causes[0].rank == KINDS.index("teardown") and kinds[0] == "killed"
        assert kinds[1:] == ["collateral"]
        return
    else:
        assert kinds[0] == present[0]


def test_the_reported_bug_rank_1_killed_rank_2_collateral() -> None:
    """#18: rank 2's 'Connection reset by peer' is collateral of rank 1's SIGKILL, even when
    rank 2's exit is reported first and its record is older."""
    log = StepLog(
        (
            TaskEnd(2, "node2", exit_code=1, order=0),
            TaskEnd(1, "node1", signal="SIGKILL", order=1),
        )
    )
    raised = [Raised(2, "node2", "RuntimeError", RESET, "mlp.py:80", time=1.0)]
    causes = rank_causes(log, raised)
    assert [c.text for c in causes] == [
        "rank 1 on node1 killed by SIGKILL",
        f"rank 2 on node2: RuntimeError: {RESET} at mlp.py:80",
    ]
    assert [c.kind for c in causes] == ["killed", "collateral"]


def test_a_kill_srun_reports_after_the_peers_collateral_exit_is_still_the_cause() -> None:
    """Seen on the dev cluster (job 193): rank 1 SIGKILLed, rank 0 left within milliseconds
    with gloo's 'Connection closed by peer', and srun reported rank 0's exit first, then
    started the teardown, then rank 1's kill."""
    log = policy.parse_step_log(
        "srun: error: node2: task 0: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=193.0\n"
        "srun: error: node2: task 1: Killed\n"
        "srun: error: node3: tasks 2-3: Exited with exit code 1\n"
        "srun: Force Terminated StepId=193.0\n"
    )
    raised = [
        Raised(rank, host, "RuntimeError", GLOO_CLOSED, "distributed_c10d.py:3252", time=1.0)
        for rank, host in ((0, "node2"), (2, "node3"), (3, "node3"))
    ]
    causes = rank_causes(log, raised)
    assert causes[0].text == "rank 1 on node2 killed by SIGKILL"
    assert [(c.rank, c.kind) for c in causes] == [
        (1, "killed"),
        (0, "collateral"),
        (2, "collateral"),
        (3, "collateral"),
    ]
    # Two ranks killed in the teardown: the log cannot tell which one the others lost.
    two = policy.parse_step_log(
        "srun: error: node2: task 0: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=194.0\n"
        "srun: error: node2: task 1: Killed\n"
        "srun: error: node3: task 2: Killed\n"
    )
    closed = [Raised(0, "node2", "RuntimeError", GLOO_CLOSED, "c10d.py:1", time=1.0)]
    assert [c.kind for c in rank_causes(two, closed)] == ["collateral", "teardown", "teardown"]


def test_a_cpp_abort_after_a_peers_error_is_collateral() -> None:
    log = StepLog(
        (
            TaskEnd(0, "node1", signal="SIGABRT", order=0),
            TaskEnd(3, "node2", exit_code=1, order=1),
        )
    )
    tails = {
        0: "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "  what():  [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)"
    }
    raised = [Raised(3, "node2", "ValueError", "bad batch", "t.py:9")]
    assert [c.kind for c in rank_causes(log, raised, tails)] == ["raised", "collateral"]


def test_a_sigkill_is_never_a_reaction_to_a_peer_whatever_its_stderr_says() -> None:
    """A rank's stderr is appended across attempts: an earlier attempt's error may be in its
    tail, and no rank kills itself with SIGKILL over a peer's error."""
    log = StepLog((TaskEnd(1, "node1", signal="SIGKILL"), TaskEnd(2, "node1", exit_code=1)))
    tails = {1: f"RuntimeError: {RESET}", 2: f"RuntimeError: {RESET}"}
    assert [c.kind for c in rank_causes(log, [], tails)] == ["killed", "collateral"]


@pytest.mark.parametrize(
    ("message", "exception", "collateral"),
    [
        (RESET, "RuntimeError", True),
        (GLOO_CLOSED, "RuntimeError", True),
        ("Connection closed by peer [10.77.0.12]:40321", "RuntimeError", True),
        ("Timed out waiting 1800000ms for recv operation to complete", "RuntimeError", True),
        ("NCCL error: remote process exited or a network error", "DistBackendError", True),
        ("failed to recv, got 0 bytes", "DistNetworkError", True),
        ("anything", "DistNetworkError", True),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", "OutOfMemoryError", False),
        ("boom on rank 1", "ValueError", False),
    ],
)
def test_collateral_words(message: str, exception: str, collateral: bool) -> None:
    assert policy.is_collateral(message, exception) is collateral


@pytest.mark.parametrize(
    ("sacct", "raised", "expected"),
    [
        # the log named no rank (unreadable): accounting's signal comes first
        ("5.0|FAILED|0:9|node[1-2]\n", True, "a rank of step 5.0 on node[1-2] killed by SIGKILL"),
        ("5.0|OUT_OF_MEMORY|0:125|node1\n", False, "a rank of step 5.0 on node1 killed by the "),
        # a plain exit code says less than a failure record
        ("5.0|FAILED|1:0|node[1-2]\n", True, "rank 2 on node2: RuntimeError: boom"),
        ("5.0|FAILED|1:0|node[1-2]\n", False, "a rank of step 5.0 on node[1-2] exited with"),
        ("5.batch|FAILED|0:9|node1\n5.extern|COMPLETED|0:0|node1\n", False, None),
    ],
)
def test_accounting_only_when_the_log_named_no_rank(
    sacct: str, raised: bool, expected: str | None
) -> None:
    records = [Raised(2, "node2", "RuntimeError", "boom", None)] if raised else []
    steps = policy.parse_sacct_steps(sacct)
    causes = rank_causes(StepLog(), records, steps=steps)
    if expected is None:
        assert causes == []
    else:
        assert causes[0].text.startswith(expected), causes


# ------------------------------------------------------------------ the end hook


def test_the_end_hook_records_the_killed_rank_of_a_crashed_attempt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": None}])
    (run / "logs").mkdir()
    # An earlier attempt's report above this attempt's start line must not count.
    (run / "logs" / "batch-9.out").write_text(
        "srun: error: node2: task 3: Killed\n"
        "[ddlaunch] attempt 0 on node[1-2], resuming from scratch\n" + step_part(1)
    )
    (run / "failures").mkdir()
    peer = {"rank": 2, "host": "node2", "job_id": "9", "attempt": 0, "time": 5.0}
    (run / "failures" / "rank-2.json").write_text(
        json.dumps({**peer, "exception": "RuntimeError", "message": RESET})
    )
    runner = FakeRunner(
        {"sinfo": "node1|allocated\nnode2|allocated\n", "sacct": fixture("sacct-steps.txt")}
    )
    settings = hooks.HookSettings(ranks_per_node=2)
    assert hooks.end(run, 137, SlurmClient(runner), AttemptId("9", 0, "9"), settings) == 0
    record = attempt_json(run)[0]
    assert record["cause"] == "crash"
    assert record["culprit"] == "rank 1 on node1 killed by SIGKILL"
    assert record["causes"][0] == {
        "rank": 1,
        "host": "node1",
        "kind": "killed",
        "text": "rank 1 on node1 killed by SIGKILL",
        "source": "srun",
    }
    assert record["ranks_ended"][0] == {"rank": 1, "host": "node1", "signal": "SIGKILL"}
    assert record["step_accounting"]
    assert ["scontrol", "requeue", "9"] in runner.calls


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, ["rank 1 on node1 killed by SIGKILL", *(f"rank {r}" for r in (0, 2, 3))]),
        (1, []),  # the attempt that completed: the first attempt's reports are not its own
    ],
)
def test_each_attempt_of_a_real_requeued_batch_log(
    tmp_path, index: int, expected: list[str]
) -> None:
    """The batch log of job 1550 (recorded): rank 1 killed, its peers raised gloo's
    "Connection closed by peer", the job requeued and appended its second attempt."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "batch-1550.out").write_text(fixture("batch-kill-requeue.out"))
    (run / "failures").mkdir()
    for rank, host in ((0, "node1"), (2, "node2"), (3, "node2")):
        record = {"rank": rank, "host": host, "job_id": "1550", "attempt": 0, "time": 9.0}
        record.update(exception="RuntimeError", message=GLOO_CLOSED, where="c10d.py:3252")
        (run / "failures" / f"rank-{rank}.json").write_text(json.dumps(record))
    steps = ("1550.0|CANCELLED|0:15|node[1-2]", "1550.0|COMPLETED|0:0|node[1-2]")[index]
    client = SlurmClient(FakeRunner({"sacct": steps + "\n"}))
    got = collect.attribute(run, AttemptId("1550", index, "1550"), index, client)
    causes = got["causes"]
    assert len(causes) == len(expected)
    assert [c["text"][: len(e)] for c, e in zip(causes, expected, strict=True)] == expected
    if index == 0:
        assert [c["kind"] for c in causes] == ["killed", *["collateral"] * 3]
        assert got["culprit"] == "rank 1 on node1 killed by SIGKILL"
        assert [e.get("teardown", False) for e in got["ranks_ended"]] == [False, True, True, True]


def test_without_its_start_line_an_attempt_starts_after_the_requeue_note() -> None:
    text = fixture("batch-kill-requeue.out")
    assert "DUE TO JOB REQUEUE" in text
    without = text.replace("[ddlaunch] attempt 1 on", "[something else] on")
    part = collect.attempt_part(without, 1)
    assert "task 1: Killed" not in part and "COMPLETED: completed" in part
    assert collect.attempt_part(text, 0).startswith("[ddlaunch] attempt 0 on")


def test_attribution_never_costs_the_attempt_its_conclusion(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(collect, "attribute", lambda *a, **k: 1 / 0)
    assert collect.attribute_safely(tmp_path, AttemptId("9", 0, "9"), 0, None) == {}


@pytest.mark.parametrize("layout", ["rank", "node"])
@pytest.mark.parametrize(("stepd", "host", "execve", "cancelled"), STEPD_FORMS)
def test_a_rank_that_never_ran_is_named_from_its_own_stderr(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    stepd: tuple[str, str],
    host: str,
    execve: str,
    cancelled: str,
) -> None:
    """#48: with a log file per rank (or per node) slurmstepd's execve() error is in the
    rank's stderr, and the batch log has only srun's report of its exit. Only the files of
    the ranks srun named outside the teardown are read."""
    run = tmp_path / "run"
    logs = run / "logs"
    logs.mkdir(parents=True)
    (logs / "batch-15.out").write_text(
        f"[ddlaunch] attempt 0 on {host}, resuming from scratch\n"
        f"srun: error: {host}: task 0: Exited with exit code 2\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=15.1\n"
        f"srun: error: {host}: task 1: Exited with exit code 2\n"
    )
    failed = stepd[0]
    if layout == "rank":
        for rank in (0, 1):
            (logs / f"rank-{rank}.err").write_text(f"{failed}\n")
    else:  # srun --label: each line of the node's file starts with its rank
        (logs / f"node-{host}.err").write_text(f"0: {failed}\n1: {failed}\n")
    read: list[int] = []
    tail = collect.rank_err_tail

    def spy(run_dir: Path, rank: int, where: str) -> str:
        read.append(rank)
        return tail(run_dir, rank, where)

    monkeypatch.setattr(collect, "rank_err_tail", spy)
    client = SlurmClient(FakeRunner({"sacct": ""}))
    got = collect.attribute(run, AttemptId("15", 0, "15"), 0, client)
    assert got["culprit"] == f"rank 0 on {host} could not start ({execve})"
    ended = got["ranks_ended"]
    assert isinstance(ended, list)
    assert ended[0] == {
        "rank": 0, "host": host, "exit_code": 2, "not_started": execve
    }  # fmt: skip
    assert read == [0]  # rank 1 was ended by the teardown: its file is not opened
    # A rank's stderr is appended across attempts: once the rank printed after the line (its
    # program ran in a later attempt), the line is no longer that attempt's cause.
    usage = "usage: train.py [-h] [--lr LR]"
    with open(logs / ("rank-0.err" if layout == "rank" else f"node-{host}.err"), "a") as err:
        err.write(f"{usage}\n" if layout == "rank" else f"0: {usage}\n")
    got = collect.attribute(run, AttemptId("15", 0, "15"), 0, client)
    assert got["culprit"] == f"rank 0 on {host} exited with exit code 2 without a Python exception"


# The kernel's OOM killer's words (mm/oom_kill.c's format; no OOM was provoked on the
# shared dev cluster to record one).
KERNEL_OOM = (
    "3,1201,6351000000,-;Memory cgroup out of memory: Killed process 4242 (python3) "
    "total-vm:9000000kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB, UID:0 "
    "pgtables:16000kB oom_score_adj:0\n"
    "3,1202,6351000001,-;Out of memory: Killed process 777 (python3) total-vm:1kB\n"
)


def test_a_sigkill_the_kernel_log_pins_on_the_oom_killer(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "batch-9.out").write_text(
        "srun: error: node1: task 1: Killed\nsrun: error: node2: task 2: Killed\n"
    )
    beats = run / "health" / "heartbeat"
    beats.mkdir(parents=True)
    for rank, pid in ((1, 4242), (2, 777)):  # rank 2's pid is another node's process
        (beats / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "pid": pid}))
    client = SlurmClient(FakeRunner({"sacct": ""}))
    got = collect.attribute(run, AttemptId("9", 0, "9"), 0, client, kernel_log=lambda: KERNEL_OOM)
    assert [c["text"] for c in got["causes"]] == [
        "rank 1 on node1 killed by the out-of-memory killer",
        "rank 2 on node2 killed by SIGKILL",
    ]
    assert policy.oom_killed_pids(KERNEL_OOM) == {4242, 777}


def test_the_kernel_log_is_read_only_for_a_sigkill_on_this_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "batch-9.out").write_text("srun: error: node1: task 1: Segmentation fault\n")

    def unread() -> str:
        raise AssertionError("the kernel log was read")

    client = SlurmClient(FakeRunner({"sacct": ""}))
    got = collect.attribute(run, AttemptId("9", 0, "9"), 0, client, kernel_log=unread)
    assert got["culprit"] == "rank 1 on node1 killed by SIGSEGV"


def test_ends_are_counted_by_kind_and_by_node_outside_the_teardown() -> None:
    ends = [
        TaskEnd(5, "node1", signal="SIGKILL"),
        TaskEnd(6, "node1", exit_code=1),
        TaskEnd(7, "node2", oom=True, signal="SIGKILL"),
        TaskEnd(8, "node3", exit_code=2, not_started="execve(): apptainer: No such file"),
        TaskEnd(9, "node3", signal="SIGTERM", teardown=True),
        TaskEnd(10, "node4", signal="SIGTERM", teardown=True),
        TaskEnd(11, "node4"),
    ]
    assert policy.count_ends(ends) == {
        "kind": {
            "SIGKILL": 1, "exit 1": 1, "not started": 1, "oom": 1, "teardown": 2, "unknown": 1,
        },
        "node": {"node1": 2, "node2": 1, "node3": 1, "node4": 1},
    }  # fmt: skip
    assert policy.count_ends([]) == {"kind": {}, "node": {}}
