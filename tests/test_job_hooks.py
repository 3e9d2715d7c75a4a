"""The batch-script hooks with recorded Slurm output: the start hook closes a cut-off attempt
and blames down nodes; the end hook requeues a crash that made progress, stops one that did
not, blames the node whose ranks died silently, and completes a run whose ranks finished
after an in-process restart although srun reports the replaced rank's status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.rundirs import attempt_json, committed_run, write_attempts

from ddlaunch.job import hooks
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.exclusions import excluded

JOB_9 = AttemptId("9", 0, "9")


@pytest.fixture(autouse=True)
def bad_list(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The hooks record blamed nodes in my bad-node list: the test's own."""
    path = tmp_path / "bad.json"
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(path))
    return path


def test_start_closes_a_cut_off_attempt_and_blames_down_nodes(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40])
    write_attempts(
        run,
        [{"attempt": 0, "job_id": "7", "nodes": "node[1-2]", "start": 1.0, "resumed_from": None}],
    )
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node[1,3]"}
    # Recorded from the dev cluster: `sinfo -h -N -o '%N|%T' -n node1,node2` after a node kill.
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|down*\n"})
    hooks.start(run, SlurmClient(runner), AttemptId.from_env(env), env)
    records = attempt_json(run)
    assert records[0]["cause"] == "requeued by Slurm" and records[0]["blamed"] == ["node2"]
    assert records[0]["committed_step"] == 40
    assert records[1] == {
        **records[1],
        "attempt": 1,
        "restart_count": 1,
        "nodes": "node[1,3]",
        "resumed_from": 40,
    }
    assert excluded(run) == ["node2"]
    assert runner.calls == [["sinfo", "-h", "-N", "-o", "%N|%T", "-n", "node1,node2"]]


def test_start_of_a_resumed_run_closes_the_other_jobs_attempt_as_slurm_recorded_it(
    tmp_path,
) -> None:
    """The run's last job was killed before its end hook (its batch script SIGKILLed) and the
    user resumed it as a new job: Slurm requeued nothing, so the attempt is closed as the
    job ended by Slurm's accounting, not as requeued by Slurm."""
    run = committed_run(tmp_path, [20, 40])
    write_attempts(
        run,
        [{"attempt": 0, "job_id": "4259", "nodes": "node1", "start": 1.0, "resumed_from": None}],
    )
    env = {"SLURM_JOB_ID": "4260", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node2"}
    # sacct -X -P -n -o JobID,State,NodeList,Reason of a job whose batch script was killed.
    runner = FakeRunner({"sinfo": "node1|idle\n", "sacct": "4259|FAILED|node1|None\n"})
    hooks.start(run, SlurmClient(runner), AttemptId.from_env(env), env)
    first = attempt_json(run)[0]
    assert first["cause"] == "job ended" and first["blamed"] == []
    assert first["culprit"] == (
        "job 4259 ended FAILED before its end hook ran; the run went on as job 4260"
    )
    assert first["committed_step"] == 40
    assert excluded(run) == []


def test_end_requeues_a_crash_that_made_progress(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": 20}])
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n"})
    assert hooks.end(run, 1, SlurmClient(runner), JOB_9) == 0
    assert ["scontrol", "requeue", "9"] in runner.calls
    assert attempt_json(run)[0]["cause"] == "crash"
    assert not (run / "outcome.json").exists()


def test_end_stops_a_crash_without_progress(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40])
    write_attempts(
        run,
        [
            {"attempt": 0, "nodes": "node[1-2]", "resumed_from": None, "end": 1},
            {"attempt": 1, "nodes": "node[1-2]", "resumed_from": 40},
        ],
    )
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n"})
    assert hooks.end(run, 1, SlurmClient(runner), JOB_9) == 1
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["state"] == "FAILED"
    assert outcome["reason"] == (
        "stopped: no progress in the last attempt (the committed step stayed at 40)"
    )


def test_end_blames_the_node_whose_ranks_died_silently(tmp_path) -> None:
    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": None}])
    (run / "failures").mkdir()
    for rank in (0, 1):  # the ranks on node1 raised (a peer vanished); node2's were killed
        (run / "failures" / f"rank-{rank}.json").write_text(
            json.dumps(
                {
                    "rank": rank,
                    "host": "node1",
                    "job_id": "9",
                    "attempt": 0,
                    "exception": "RuntimeError",
                    "message": "Connection reset by peer",
                }
            )
        )
    runner = FakeRunner(
        {
            "sinfo": "node1|allocated\nnode2|allocated\n",  # Slurm has not noticed yet
            "scontrol show config": "SlurmdPort              = 1\n",  # nothing listens on port 1
            "scontrol show node -o node2": "NodeName=node2 NodeAddr=127.0.0.1 State=ALLOCATED",
        }
    )
    settings = hooks.HookSettings(ranks_per_node=2)
    assert hooks.end(run, 137, SlurmClient(runner), JOB_9, settings) == 0
    record = attempt_json(run)[0]
    assert record["cause"] == "node failure" and record["blamed"] == ["node2"]
    assert ["scontrol", "update", "JobId=9", "ExcNodeList=node2"] in runner.calls
    assert runner.calls[-1] == ["scontrol", "requeue", "9"]
    assert not any(c[-1] == "node1" for c in runner.calls if c[:3] == ["scontrol", "show", "node"])


def test_end_completes_a_run_whose_ranks_finished_after_an_in_process_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fault_tolerance.restart: in_process: rank 3 was killed and a standby took it; every
    rank of the new generation returned (rank 0's in_process_done). srun still says 137,
    the killed rank's: the run completed, and the script exits 0 for Slurm to say so."""
    run = committed_run(tmp_path, [20, 40])
    restart = {"time": 5.0, "generation": 1, "ranks": [3], "hosts": ["node2"], "cause": "crash"}
    restart |= {"replacements": [{"rank": 3, "host": "node2", "pid": 4242}], "rejoined_s": 1.5}
    attempt = {"attempt": 0, "job_id": "9", "nodes": "node[1-2]", "resumed_from": None}
    write_attempts(run, [{**attempt, "in_process_restarts": [restart], "in_process_done": 9.0}])
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n", "sacct": ""})
    assert hooks.end(run, 137, SlurmClient(runner), JOB_9, can_restart=True) == 0
    record = attempt_json(run)[0]
    assert (record["cause"], record["committed_step"], record["exit_code"]) == (
        "completed",
        40,
        137,
    )
    assert json.loads((run / "outcome.json").read_text())["state"] == "COMPLETED"
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    assert capsys.readouterr().err == (
        "[ddlaunch] the ranks finished after 1 in-process restart (rank 3 on node2 replaced); "
        "srun's status 137 is taken for the replaced rank's, not the run's\n"
    )


def test_end_treats_an_in_process_restart_without_a_finish_as_a_crash(tmp_path: Path) -> None:
    """The ranks never all returned (no in_process_done): srun's status is the run's."""
    run = committed_run(tmp_path, [20, 40])
    restart = {"time": 5.0, "generation": 1, "ranks": [3], "hosts": ["node2"], "cause": "crash"}
    attempt = {"attempt": 0, "job_id": "9", "nodes": "node[1-2]", "resumed_from": 20}
    write_attempts(run, [{**attempt, "in_process_restarts": [restart]}])
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|allocated\n"})
    assert hooks.end(run, 137, SlurmClient(runner), JOB_9) == 0
    assert attempt_json(run)[0]["cause"] == "crash"
    assert ["scontrol", "requeue", "9"] in runner.calls


def test_end_concludes_a_signal_save_the_containerised_ranks_left_to_the_host(tmp_path) -> None:
    # In a container rank 0 has no scontrol: it records the save, the ranks exit 0, and the
    # end hook (on the host) requeues as rank 0 would have.
    from ddlaunch.store import signal_save

    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "job_id": "9", "nodes": "node[1-2]", "resumed_from": 20}])
    signal_save.write(run, JOB_9, 40, "SIGUSR2")
    runner = FakeRunner({"sacct": ""})
    assert hooks.end(run, 0, SlurmClient(runner), JOB_9) == 0
    assert ["scontrol", "requeue", "9"] in runner.calls
    record = attempt_json(run)[0]
    assert (record["cause"], record["committed_step"], record["signal"]) == (
        "signal",
        40,
        "SIGUSR2",
    )
    assert not (run / "outcome.json").exists()


def _verdict(run, cause: str) -> None:  # type: ignore[no-untyped-def]
    from ddlaunch.store import watchdog

    detail = (
        "rank(s) 1 stuck outside any collective while peers wait at hangmod.py:6 in on_step"
        if cause == "hang"
        else "node2 busy 3.1x the median for 300 s"
    )
    verdict = watchdog.Verdict(cause=cause, nodes=("node2",), detail=detail)
    watchdog.write_verdict(run, JOB_9, verdict)


def test_a_hang_excludes_the_node_from_the_run_but_only_suspects_it(tmp_path, bad_list) -> None:  # type: ignore[no-untyped-def]
    from ddlaunch.store import badnodes

    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": 20}])
    _verdict(run, "hang")
    runner = FakeRunner()
    assert hooks.end(run, 137, SlurmClient(runner), JOB_9) == 0
    assert excluded(run) == ["node2"] and attempt_json(run)[0]["cause"] == "hang"
    assert badnodes.active_nodes(bad_list) == []  # later jobs may still use it
    (suspect,) = badnodes.suspects(badnodes.load(bad_list), 0.0)
    assert (suspect.node, suspect.source) == ("node2", "run run")


def test_a_straggler_and_a_node_death_are_evidence_about_the_node(tmp_path, bad_list) -> None:  # type: ignore[no-untyped-def]
    from ddlaunch.store import badnodes

    run = committed_run(tmp_path, [20, 40])
    write_attempts(run, [{"attempt": 0, "nodes": "node[1-2]", "resumed_from": 20}])
    _verdict(run, "straggler")
    assert hooks.end(run, 137, SlurmClient(FakeRunner()), JOB_9) == 0
    assert badnodes.active_nodes(bad_list) == ["node2"]
    badnodes.save([], bad_list)
    # A node Slurm declared down while the job ran (the start hook of the next attempt).
    records = attempt_json(run)
    records.append({"attempt": 1, "job_id": "9", "nodes": "node[1-2]", "start": 2.0})
    write_attempts(run, records)
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "node[1,3]"}
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|down*\n"})
    hooks.start(run, SlurmClient(runner), AttemptId.from_env(env), env)
    (entry,) = badnodes.active(badnodes.load(bad_list), 0.0)
    assert (entry.node, entry.reason) == ("node2", "node failure: node2 down*")


@pytest.mark.parametrize(
    ("deadline", "said"),
    [
        (None, "time limit in 120 s"),  # a script that does not pass the limit
        (1000.0 + 118, "time limit in 118 s"),  # Slurm's pre-timeout signal
        (1000.0 + 29 * 60, "stop signal received with 29 min left before the time limit"),
    ],
)
def test_the_stop_hook_says_a_signal_by_hand_is_not_the_time_limit(deadline, said) -> None:
    assert hooks.stop_reason(deadline, 1000.0, 120) == said
