"""The follow engine (``app.follow``): what it prints, when it stops, the Slurm calls it makes.
The CLI's whole outputs are in test_logs_follow_cli.py."""

from __future__ import annotations

import os
from pathlib import Path

from support.fakes import FakeRunner, ok
from support.rundirs import example_run_dir

from ddlaunch.app.follow import LogStream, RunWatch, follow
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.outcome import write_outcome
from ddlaunch.store.submission import Submission, write_submission

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80"}


def append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_follow_goes_on_across_a_requeue_and_asks_slurm_once_per_interval(tmp_path: Path) -> None:
    # Recorded forms of squeue's status line (tests/fixtures/slurm-22.05): the job runs, is
    # requeued (pending again), runs its second attempt; then the end hook writes the outcome.
    run = example_run_dir(tmp_path)
    write_submission(run, Submission(job_ids=("41",)))
    states = iter(
        [
            "41|RUNNING|None|node[1-2]",
            "41|PENDING|BeginTime|",
            "41|RUNNING|None|node1",
            "41|RUNNING|None|node1",
        ]
    )
    runner = FakeRunner({"squeue": lambda argv: ok(next(states))})
    now = [0.0]
    printed: list[str] = []
    batch = run / "logs" / "batch-41.out"
    script = {
        2.0: "[ddlaunch] attempt 0 on node[1-2], resuming from scratch\n",
        40.0: "[ddlaunch] requeued: progress 0 -> 60\n",
        70.0: "[ddlaunch] attempt 1 on node1, resuming from step 60\n",
    }

    def sleep(seconds: float) -> None:
        now[0] += seconds
        for at in [t for t in script if t <= now[0]]:
            append(batch, script.pop(at))
        if now[0] >= 95 and not (run / "outcome.json").exists():
            append(batch, "[ddlaunch] COMPLETED: finished\n")
            write_outcome(run, "COMPLETED", "finished")

    watch = RunWatch(run, SlurmClient(runner), interval=30.0, clock=lambda: now[0])
    end = follow(LogStream(run), watch, printed.append, sleep=sleep, clock=lambda: now[0])
    assert end.state == "COMPLETED" and end.exit_code == 0
    assert "".join(printed) == (
        f"==> {batch} <==\n"
        "[ddlaunch] attempt 0 on node[1-2], resuming from scratch\n"
        "[ddlaunch] requeued: progress 0 -> 60\n"
        "[ddlaunch] attempt 1 on node1, resuming from step 60\n"
        "[ddlaunch] COMPLETED: finished\n"
    )
    # ~190 polls of the files in 95 s, and Slurm was asked at 0, 30, 60 and 90 s only.
    assert runner.count("squeue") == 4 == watch.queries
    assert all(c[0] == "squeue" for c in runner.calls)


def test_follow_ends_when_slurm_says_the_job_ended_without_an_outcome(tmp_path: Path) -> None:
    run = example_run_dir(tmp_path)
    write_submission(run, Submission(job_ids=("52",)))
    runner = FakeRunner({"squeue": "52|TIMEOUT|TimeLimit|node1\n"})
    end = follow(
        LogStream(run), RunWatch(run, SlurmClient(runner)), [].append, sleep=lambda s: None
    )
    assert (end.state, end.exit_code) == ("TIMEOUT", 1)
    assert runner.count("squeue") == 1


def test_prefix_mode_labels_every_line(tmp_path: Path) -> None:
    run = example_run_dir(tmp_path)
    (run / "logs" / "batch-7.out").write_text("[ddlaunch] attempt 0\n")
    (run / "logs" / "rank-0.out").write_text("a\n")
    (run / "logs" / "rank-1.err").write_text("b\npartial")
    printed: list[str] = []
    stream = LogStream(run, ranks=None, prefix=True)
    stream.pump(printed.append)
    stream.flush(printed.append)
    assert "".join(printed) == (
        "[batch] [ddlaunch] attempt 0\n[rank 0] a\n[rank 1] b\n[rank 1] partial\n"
    )


PREFLIGHT = (
    "[ddlaunch preflight node1] ok; bandwidth: 9.8 Gbit/s ring (2.1 s)\n"
    "[ddlaunch preflight node2] ok; bandwidth: 9.7 Gbit/s ring (2.0 s)\n"
    "[ddlaunch] preflight: all 2 nodes passed\n"
)


def test_submit_follow_prints_each_preflight_line_once_per_attempt(tmp_path: Path) -> None:
    # Rank 0's gate and the batch host both write the preflight's lines, each into its own
    # log; a requeued attempt writes the same lines again, which are new lines to show.
    run = example_run_dir(tmp_path)
    logs = run / "logs"
    now = [0.0]
    script = {
        1.0: ("batch-41.out", "[ddlaunch] attempt 0 on node[1-2]\n"),
        2.0: ("rank-0.out", PREFLIGHT + "step 10\n"),
        3.0: ("batch-41.out", PREFLIGHT + "[ddlaunch] requeued: progress 0 -> 10\n"),
        4.0: ("batch-42.out", "[ddlaunch] attempt 1 on node[1-2]\n" + PREFLIGHT),
        5.0: ("rank-0.out", PREFLIGHT + "step 20\n"),
    }

    def sleep(seconds: float) -> None:
        now[0] += seconds
        for at in [t for t in script if t <= now[0]]:
            name, text = script.pop(at)
            append(logs / name, text)
        if now[0] >= 6 and not (run / "outcome.json").exists():
            write_outcome(run, "COMPLETED", "finished")

    printed: list[str] = []
    stream = LogStream(run, (0,))  # what `submit --follow` follows: batch logs and rank 0
    end = follow(stream, RunWatch(run), printed.append, sleep=sleep, clock=lambda: now[0])
    assert end.state == "COMPLETED"
    assert "".join(printed) == (
        f"==> {logs / 'batch-41.out'} <==\n"
        "[ddlaunch] attempt 0 on node[1-2]\n"
        f"==> {logs / 'rank-0.out'} <==\n"
        f"{PREFLIGHT}"
        "step 10\n"
        f"==> {logs / 'batch-41.out'} <==\n"
        "[ddlaunch] requeued: progress 0 -> 10\n"
        f"==> {logs / 'batch-42.out'} <==\n"
        "[ddlaunch] attempt 1 on node[1-2]\n"
        f"{PREFLIGHT}"
        f"==> {logs / 'rank-0.out'} <==\n"
        "step 20\n"
    )
