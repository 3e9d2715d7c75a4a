"""Whom ``status`` blames while a node dies (issue 51): a victim rank's record ("connection
closed by peer") is no headline while the verdict is pending; the verdict is, once recorded,
whichever came first. And a run that stopped says why beside what failed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.rundirs import T0, make_run
from support.samples import NODE_FAILURE_VERDICT, VICTIM_FAILURE

from ddlaunch.app.runs import read_run
from ddlaunch.app.status import RunStatus, run_status
from ddlaunch.app.status_blame import Blame, blame, pending_words, verdict_words
from ddlaunch.app.status_poll import StatusView
from ddlaunch.cli.status import note, page
from ddlaunch.store import attempts, watchdog
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import Failure

VICTIM = Failure(
    rank=6,
    host="node4",
    exception="RuntimeError",
    message="Connection closed by peer [10.77.0.15]:3792",
    where=None,
)
NODE5 = verdict_words("node failure", ["node5"], "Slurm reports it not responding")


# --- the rule itself -------------------------------------------------------------------------


def test_a_rank_failure_in_a_running_attempt_is_pending_not_the_runs_failure() -> None:
    said = blame(ended=False, attempt_open=True, failure=VICTIM, verdict=None)
    assert said.headline is None
    assert said.meanwhile == (
        "rank 6 on node4 failed, verdict pending: "
        "RuntimeError: Connection closed by peer [10.77.0.15]:3792"
    )


@pytest.mark.parametrize("failure", [None, VICTIM], ids=["verdict first", "record first"])
def test_a_recorded_verdict_is_said_whichever_came_first(failure: Failure | None) -> None:
    said = blame(ended=False, attempt_open=True, failure=failure, verdict=NODE5)
    assert said == Blame(meanwhile="node failure of node5: Slurm reports it not responding")


def test_a_run_that_ended_with_its_attempt_open_blames_the_verdict_over_the_victim() -> None:
    assert blame(ended=True, attempt_open=True, failure=VICTIM, verdict=NODE5).headline == NODE5
    only = blame(ended=True, attempt_open=True, failure=VICTIM, verdict=None)
    assert only.headline == VICTIM.one_line() and only.meanwhile is None


def test_a_concluded_attempt_is_history_until_the_run_ends() -> None:
    waiting = blame(ended=False, attempt_open=False, failure=None, verdict=None, concluded="x")
    assert waiting == Blame()
    ended = blame(ended=True, attempt_open=False, failure=None, verdict=None, concluded="x")
    assert ended == Blame(headline="x")


def test_the_words_of_a_verdict_and_of_a_pending_failure() -> None:
    assert verdict_words("hang", ["node2"], "no step for 90 s") == "hang on node2: no step for 90 s"
    assert verdict_words("hang", [], None) == "hang"
    assert pending_words(VICTIM).startswith("rank 6 on node4 failed, verdict pending")


# --- from the run directory, in both orders --------------------------------------------------


def open_run(tmp_path: Path) -> Path:
    attempt = {"attempt": 0, "job_id": "41", "start": T0, "nodes": "node[4-6]"}
    return make_run(tmp_path, "dying", "41", T0, attempts=[attempt])


def write_victim(run: Path) -> None:
    (run / "failures").mkdir(exist_ok=True)
    record = {**VICTIM_FAILURE, "time": T0 + 60}
    with open(run / "failures" / "node-node4.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")


def write_verdict(run: Path) -> None:
    (run / "health").mkdir(exist_ok=True)
    verdict = watchdog.Verdict.from_json({**NODE_FAILURE_VERDICT, "time": T0 + 64})
    watchdog.write_verdict(run, AttemptId("41", 0, "41"), verdict)


def row_of(run: Path, state: str) -> RunStatus:
    return run_status(read_run(run), None, shown={"JobState": state}, now=T0 + 70)


NODE5_SAID = (
    "node failure of node5: node5 stopped beating; Slurm reports it not responding "
    "(4 s into the attempt)"
)


@pytest.mark.parametrize("verdict_first", [False, True], ids=["record first", "verdict first"])
def test_status_of_a_running_run_while_a_node_dies(tmp_path: Path, verdict_first: bool) -> None:
    run = open_run(tmp_path)
    if verdict_first:
        write_verdict(run)
        write_victim(run)
    else:
        write_victim(run)
        row = row_of(run, "RUNNING")
        assert row.failure is None  # was: the victim's RuntimeError as the run's failure
        assert row.failing is not None and row.failing.startswith(
            "rank 6 on node4 failed, verdict pending: RuntimeError"
        )
        assert (
            page(StatusView([row], Path("/r")), 200)
            .splitlines()[0]
            .startswith("RUNNING: rank 6 on node4 failed, verdict pending")
        )
        write_verdict(run)
    row = row_of(run, "RUNNING")
    assert row.failure is None and row.failing == NODE5_SAID
    assert not page(StatusView([row], Path("/r")), 200).startswith("FAILED")


def test_status_of_a_requeued_run_whose_watchdog_found_the_node_dead(tmp_path: Path) -> None:
    """No spare: the watchdog says the node, Slurm requeues the job once it declares it down;
    the attempt stays open until the next start closes it. PENDING, not FAILED."""
    run = open_run(tmp_path)
    write_victim(run)
    assert row_of(run, "PENDING").failing is not None
    assert row_of(run, "PENDING").failure is None
    attempts.update_open(run, dead_nodes=["node5"], dead_why="node5 stopped beating")
    row = row_of(run, "PENDING")
    assert row.failure is None and row.failing == "node failure of node5: node5 stopped beating"


# --- why a run stopped, in the human output --------------------------------------------------


def test_a_stopped_run_says_why_beside_what_failed(tmp_path: Path) -> None:
    attempt = {
        "attempt": 0, "job_id": "41", "start": T0, "end": T0 + 90, "nodes": "node[4-6]",
        "cause": "node failure", "blamed": ["node5"], "culprit": "node failure of node5",
    }  # fmt: skip
    stopped = "stopped: 2 requeues reached fault_tolerance.max_requeues=2"
    run = make_run(tmp_path, "stopped", "41", T0, attempts=[attempt], outcome=("FAILED", stopped))
    row = run_status(read_run(run), None, now=T0 + 100)
    assert row.failure == "node failure of node5" and row.detail == stopped
    shown = page(StatusView([row], Path("/r")), 200)
    assert shown.splitlines()[0] == f"FAILED node failure of node5; {stopped}"
    assert note(row).startswith(f"node failure of node5; {stopped}")


GLOO = Failure(
    rank=1,
    host="node1",
    exception="RuntimeError",
    message=(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[10.77.0.12]:25767: Connection reset by peer. This is typically caused by a remote "
        "worker hanging or bugs in the application. Check the logs of the remote worker "
        "before reporting an error."
    ),
    where="/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252",
)


def test_a_pending_collective_error_is_said_by_its_one_fact() -> None:
    assert pending_words(GLOO) == (
        "rank 1 on node1 failed, verdict pending: "
        "RuntimeError: Read error [10.77.0.12]:25767: Connection reset by peer"
    )


def test_a_single_runs_page_says_a_pending_failure_once_above_the_table(tmp_path: Path) -> None:
    """The headline says it; the table's note under it does not say it again."""
    row = dataclasses.replace(
        run_status(read_run(make_run(tmp_path, "r", "377", T0)), None, now=T0),
        state="RUNNING",
        failing=pending_words(GLOO),
    )
    text = page(StatusView(rows=[row], root=tmp_path, hidden=0, names=["r"]), None)
    assert text.count("Connection reset by peer") == 1, text
    assert text.splitlines()[0].startswith("RUNNING: rank 1 on node1 failed, verdict pending")
