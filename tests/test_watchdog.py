"""The watchdog (batch host): verdicts and ending the step, the deferred pre-timeout signal,
and a node that dies under the attempt (said, not acted on)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.rundirs import write_beat

from ddlaunch.job.watchdog import watch
from ddlaunch.job.watches import NodeFailureWatch
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker.node_task import catch_preempt_signal

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm-22.05"
T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=5, straggler_factor=2.0, straggler_patience=30
)


def test_watchdog_writes_the_verdict_and_ends_the_step(tmp_path: Path) -> None:
    steps = (FIXTURES / "squeue-steps.txt").read_text()
    runner = FakeRunner({"squeue": CommandResult(("squeue",), 0, steps, "")})
    now = 5000.0
    for rank, (host, waiting) in enumerate([("a", True), ("b", False)]):
        write_beat(
            tmp_path,
            rank=rank,
            host=host,
            job_id="377",
            restart=1,
            step=40,
            step_wall=now - 100,
            beat=now - 1,
            started=now - 200,
            state="running",
            waiting=waiting,
            where="x.py:1 in f",
        )
    finding = watch(
        tmp_path,
        attempt=AttemptId("377", 1, "377"),
        thresholds=T,
        expected_ranks=2,
        srun_pid=None,
        client=SlurmClient(runner),
        clock=iter([now - 250, now]).__next__,  # the watchdog started before the ranks
        sleep=lambda s: None,
        max_polls=1,
    )
    assert finding is not None and finding.nodes == ("b",)
    verdict = json.loads((tmp_path / "health" / "verdict-377-1.json").read_text())
    assert verdict["cause"] == "hang" and verdict["nodes"] == ["b"]
    assert ["scancel", "--signal=KILL", "377.1"] in runner.calls  # not 377.batch
    assert json.loads((tmp_path / "health" / "watchdog.json").read_text())["step"] == 40
    assert (tmp_path / "health" / "steps.jsonl").read_text().count("\n") == 1


def two_ranks_beat(run_dir: Path, job_id: str, step: int, state: str, now: float) -> None:
    """Ranks 0 and 1 of attempt 0 on node1, both at ``step``, their last beat just now."""
    for rank in (0, 1):
        write_beat(
            run_dir,
            rank=rank,
            host="node1",
            job_id=job_id,
            restart=0,
            step=step,
            step_wall=now - 1,
            beat=now - 0.5,
            started=now - 10,
            state=state,
        )


def test_an_attempt_shorter_than_one_poll_still_has_its_step_history(tmp_path: Path) -> None:
    """srun ended before the first poll (a short attempt whose ranks leave at once): the
    ranks' last beats still become the attempt's summary and its step-history sample."""
    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: its pid is no longer alive
    now = 7000.0
    two_ranks_beat(tmp_path, "378", 100, "closed", now)
    finding = watch(
        tmp_path,
        attempt=AttemptId("378", 0, "378"),
        thresholds=T,
        expected_ranks=2,
        srun_pid=finished.pid,
        client=SlurmClient(FakeRunner()),
        clock=lambda: now,
        sleep=lambda s: None,
    )
    assert finding is None
    (sample,) = (tmp_path / "health" / "steps.jsonl").read_text().splitlines()
    assert json.loads(sample)["step"] == 100 and json.loads(sample)["restart"] == 0
    assert json.loads((tmp_path / "health" / "watchdog.json").read_text())["step"] == 100


def test_the_batch_scripts_sigterm_ends_the_watchdog_after_the_last_beats(
    tmp_path: Path,
) -> None:
    """After srun returns the batch script kills the watchdog (SIGTERM): it leaves its sleep
    at once and records the ranks' last beats first (the final step of a short attempt)."""
    import signal

    from ddlaunch.job.watchdog import StopSignal

    srun = subprocess.Popen(["sleep", "30"])  # still alive: only the signal ends the watch
    now = 8000.0

    def beat(step: int, state: str) -> None:
        two_ranks_beat(tmp_path, "379", step, state, now)

    beat(40, "running")
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopSignal()
    stop.install()

    def sleep_then_sigterm(seconds: float) -> None:
        beat(100, "closed")  # the ranks finish...
        os.kill(os.getpid(), signal.SIGTERM)  # ...srun returns, the script kills the watchdog
        started = time.monotonic()
        stop.sleep(seconds)
        assert time.monotonic() - started < 1.0  # not the whole poll period

    try:
        watch(
            tmp_path,
            attempt=AttemptId("379", 0, "379"),
            thresholds=T,
            expected_ranks=2,
            srun_pid=srun.pid,
            client=SlurmClient(FakeRunner()),
            clock=lambda: now,
            sleep=sleep_then_sigterm,
            stopped=lambda: stop.received,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
        srun.kill()
        srun.wait()
    samples = (tmp_path / "health" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in samples] == [40, 100]


def test_watchdog_is_inert_without_heartbeats(tmp_path: Path) -> None:
    runner = FakeRunner()
    assert (
        watch(
            tmp_path,
            attempt=AttemptId("1", 0, "1"),
            thresholds=T,
            expected_ranks=4,
            srun_pid=None,
            client=SlurmClient(runner),
            clock=lambda: 1e9,
            sleep=lambda s: None,
            max_polls=3,
        )
        is None
    )
    assert runner.calls == []


def test_a_preempt_signal_during_a_node_check_is_noted_not_fatal(tmp_path: Path) -> None:
    # The pre-timeout signal reaches every running step: a node check (doctor, the spares'
    # preflight) must not die of it (its default action), it notes it in its report.
    import signal

    saved = signal.getsignal(signal.SIGUSR2)
    try:
        received = catch_preempt_signal({"SUBMITIT_PREEMPT_SIGNAL": "USR2"})
        os.kill(os.getpid(), signal.SIGUSR2)  # would end the task with the default action
        time.sleep(0.05)
        assert received == ["SIGUSR2"]
    finally:
        signal.signal(signal.SIGUSR2, saved)


def test_watchdog_names_a_node_that_died_under_the_attempt_and_leaves_srun_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """node2's ranks vanished; node1's failed (connection closed) and srun waits for node2:
    the watchdog probes slurmd (refused) and says so at once, but neither ends srun nor
    requeues: Slurm requeues when it declares the node down (NodeFailureWatch says why)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: connecting is refused
    failures = tmp_path / "failures"
    failures.mkdir()
    now = time.time()
    for rank in (0, 1):
        (failures / f"rank-{rank}.json").write_text(
            json.dumps({"rank": rank, "job_id": "7", "attempt": 0, "time": now - 5})
        )
    answers = {
        "sinfo": CommandResult(("sinfo",), 0, "node1|mixed\nnode2|mixed\n", ""),
        "scontrol": CommandResult(
            ("scontrol",), 0, f"SlurmdPort = {port}\nNodeName=node2 NodeAddr=127.0.0.1\n", ""
        ),
    }
    runner = FakeRunner(answers)
    srun = subprocess.Popen(["sleep", "60"])
    nodes = NodeFailureWatch(tmp_path, AttemptId("7", 0, "7"), now - 60, 2, "node[1-2]")
    try:
        watch(
            tmp_path,
            attempt=AttemptId("7", 0, "7"),
            thresholds=analysis.Thresholds(600, 10, 2.0, 300),
            expected_ranks=4,
            srun_pid=srun.pid,
            client=SlurmClient(runner),
            max_polls=3,
            sleep=lambda s: None,
            nodes=nodes,
        )
        assert srun.poll() is None  # still running
    finally:
        srun.kill()
        srun.wait()
    assert nodes.found == ["node2"]
    out = capsys.readouterr().out
    assert out.count("node failure: node2 slurmd unreachable") == 1, out
    assert not any(c[0] == "scancel" or c[:2] == ["scontrol", "requeue"] for c in runner.calls)


def test_watchdog_leaves_a_live_allocation_alone(tmp_path: Path) -> None:
    """Ranks failed but every slurmd answers: a crash, not a node failure; srun is left to
    return by itself."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    failures = tmp_path / "failures"
    failures.mkdir()
    (failures / "rank-0.json").write_text(
        json.dumps({"rank": 0, "attempt": 0, "time": time.time() - 5})
    )
    port = server.getsockname()[1]
    # scontrol names each node it shows (one call for all the suspects).
    out = f"SlurmdPort = {port}\n" + "".join(
        f"NodeName={n} NodeAddr=127.0.0.1\n" for n in ("node1", "node2")
    )
    runner = FakeRunner(
        {
            "sinfo": CommandResult(("sinfo",), 0, "node1|mixed\nnode2|mixed\n", ""),
            "scontrol": CommandResult(("scontrol",), 0, out, ""),
        }
    )
    try:
        nodes = NodeFailureWatch(tmp_path, AttemptId("7", 0, "7"), 0.0, 1, "node[1-2]")
        watch(
            tmp_path,
            attempt=AttemptId("7", 0, "7"),
            thresholds=analysis.Thresholds(600, 10, 2.0, 300),
            expected_ranks=2,
            srun_pid=None,
            client=SlurmClient(runner),
            max_polls=2,
            sleep=lambda s: None,
            nodes=nodes,
        )
    finally:
        server.close()
    assert nodes.found == []
    assert any(c[0] == "sinfo" for c in runner.calls)  # it did look


def test_the_watchdog_reads_the_failure_records_once_a_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks failed and srun still runs: each cycle reads the failure records once (16,000
    files at scale), not once to decide whether to probe and again to decide how soon."""
    from ddlaunch.job import watches

    failures = tmp_path / "failures"
    failures.mkdir()
    (failures / "rank-0.json").write_text(json.dumps({"rank": 0, "attempt": 0, "time": 1.0}))
    reads: list[int] = []
    real = watches.failed_ranks

    def counted(*args: object, **kw: object) -> list[float]:
        reads.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(watches, "failed_ranks", counted)
    two_ranks_beat(tmp_path, "7", 5, "running", 100.0)
    nodes = NodeFailureWatch(tmp_path, AttemptId("7", 0, "7"), 0.0, 1, "", grace=1e9)
    watch(
        tmp_path,
        attempt=AttemptId("7", 0, "7"),
        thresholds=T,
        expected_ranks=2,
        srun_pid=None,
        client=SlurmClient(FakeRunner()),
        clock=lambda: 100.0,
        sleep=lambda s: None,
        max_polls=3,
        nodes=nodes,
    )
    assert len(reads) == 3 and nodes.pending()


def test_a_step_sample_stays_small_at_2000_nodes(tmp_path: Path) -> None:
    # The history report draws from: the time, the step, the attempt and the slowest nodes;
    # a line per poll must not carry every node's busy time (40 KB a poll at 2,000 nodes).
    from ddlaunch.store import watchdog as records

    (tmp_path / "health").mkdir()
    busy = {f"node{i:04d}": 1.0 + (i % 7) / 100 for i in range(2000)}
    busy["node1234"] = 9.5  # the straggler
    summary = records.Summary(time=100.0, step=40, job_id="7", restart=0, busy_per_node=busy)
    records.append_sample(tmp_path, summary)
    (line,) = (tmp_path / "health" / "steps.jsonl").read_text().splitlines()
    assert len(line) < 600
    kept = json.loads(line)["busy"]
    assert (kept["nodes"], kept["median"]) == (2000, 1.03)
    assert list(kept["slowest"])[:2] == ["node1234", "node0006"]
    assert len(kept["slowest"]) == records.SLOWEST_KEPT
