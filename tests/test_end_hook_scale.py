"""The end hook's books of a crashed attempt at 2,000 nodes x 8 ranks: the culprit named from
the attempt's whole part of the batch log (one srun line per task), srun's reports parsed in
linear time, and node blame in a fixed number of Slurm calls whatever the node count."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

from support.fakes import FakeRunner
from support.rundirs import attempt_json, committed_run, write_attempts
from support.timing import cpu_seconds

from ddlaunch.config.validate import load_config
from ddlaunch.job import attribution as collect
from ddlaunch.job import hooks
from ddlaunch.job.blame import blame_nodes, probe_all
from ddlaunch.job.endings import Blame, failed_ending
from ddlaunch.policy import attribution as policy
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.store.attempts import AttemptId

FIXTURES = Path(__file__).parent / "fixtures" / "slurm-22.05"
NODES, PER_NODE = 2000, 8
RANKS = NODES * PER_NODE
NODELIST = f"node[1-{NODES}]"
JOB = AttemptId("77", 0, "77")
CULPRIT = 5


def node_of(rank: int) -> str:
    return f"node{rank // PER_NODE + 1}"


def kill_on_bad_exit_step(job: str, ranks: int, culprit: int) -> str:
    """An srun step of ``ranks`` tasks with ``--kill-on-bad-exit`` as srun 22.05 writes it
    (the recorded lines of ``batch-kill-requeue.out``, one per task as srun prints them when
    the tasks end at different moments): ``culprit`` SIGKILLed, srun's teardown, every other
    task SIGTERMed in it, slurmstepd's note, and the ranks' own output in between."""
    lines = [f"rank {r}: step 41 loss 2.3" for r in range(0, ranks, 7)]
    lines.append(f"srun: error: {node_of(culprit)}: task {culprit}: Killed")
    lines.append(f"srun: launch/slurm: _step_signal: Terminating StepId={job}.0")
    lines.append(
        f"slurmstepd-node1: error: *** STEP {job}.0 ON node1 CANCELLED AT 2026-12-02T04:00:00 ***"
    )
    lines += [
        f"srun: error: {node_of(r)}: task {r}: Terminated" for r in range(ranks) if r != culprit
    ]
    lines.append(f"srun: Force Terminated StepId={job}.0")
    return "\n".join(lines) + "\n"


def started_run(tmp_path: Path, runner: FakeRunner) -> tuple[Path, Path]:
    """A run whose batch log holds an earlier attempt's reports (a requeued job appends to
    the same file), then the start hook's attempt on 2,000 nodes, then its crashed step."""
    run = committed_run(tmp_path, [20])
    (run / "logs").mkdir()
    log = run / "logs" / "batch-77.out"
    earlier = kill_on_bad_exit_step("77", RANKS, culprit=11442)
    log.write_text(earlier + "slurmstepd-node1: error: *** JOB 77 ON node1 CANCELLED AT x ***\n")
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": NODELIST}
    hooks.start(run, SlurmClient(runner), JOB, env, hooks.HookSettings(ranks_per_node=PER_NODE))
    with open(log, "a") as handle:
        handle.write(f"[ddlaunch] attempt 0 on {NODELIST}, resuming from step 20\n")
        handle.write(kill_on_bad_exit_step("77", RANKS, CULPRIT))
    return run, log


def test_the_start_hook_records_where_its_attempt_begins_in_the_batch_log(tmp_path) -> None:
    run, log = started_run(tmp_path, FakeRunner())
    before = log.read_text().index("[ddlaunch] attempt 0 on")
    assert attempt_json(run)[0]["log_offset"] == before


def test_16000_per_task_reports_name_the_rank_that_was_killed_first(tmp_path) -> None:
    run, log = started_run(tmp_path, FakeRunner())
    assert log.stat().st_size > 4 * collect.LOG_TAIL_BYTES  # the old tail saw a quarter
    client = SlurmClient(FakeRunner({"sacct": ""}))
    got = collect.attribute(run, JOB, 0, client, log=log, kernel_log=lambda: "")
    assert got["culprit"] == "rank 5 on node1 killed by SIGKILL"
    # The record keeps the first 100 of each list and counts the rest.
    assert len(got["ranks_ended"]) == len(got["causes"]) == collect.KEEP_RANKS == 100
    assert got["ranks_ended_more"] == got["causes_more"] == RANKS - 100
    # ... and counts every end by kind and by node.
    by = got["ranks_ended_by"]
    assert by["kind"] == {"SIGKILL": 1, "teardown": RANKS - 1}
    assert by["node"] == {"node1": 1}  # where something other than the teardown happened
    assert got["causes"][0]["kind"] == "killed"
    assert {c["kind"] for c in got["causes"][1:]} == {"teardown"}
    assert len(json.dumps(got)) < 32 * 1024
    # Without the offset (a run started by an older ddlaunch) the tail cuts off both the
    # culprit's line and the teardown's start: it names a rank of the teardown instead.
    records = attempt_json(run)
    del records[0]["log_offset"]
    write_attempts(run, records)
    old = collect.attribute(run, JOB, 0, client, log=log, kernel_log=lambda: "")
    assert old["culprit"] != got["culprit"]
    assert old["culprit"].endswith("killed by SIGTERM")


def test_storage_ranks_listed_bounds_the_crashed_attempts_record(tmp_path, monkeypatch) -> None:
    """A 64-rank crash through the end hook with ``storage.ranks_listed: 8``: attempts.json
    names the first 8 ranks ended and causes (the culprit first) and counts the rest."""
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    run = committed_run(tmp_path, [20])
    (run / "logs").mkdir()
    log = run / "logs" / "batch-77.out"
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-8]"}
    cfg = load_config("examples/mlp", overrides=["storage.ranks_listed=8", "nodes.count=8"])
    settings = hooks.HookSettings.from_config(cfg)
    assert settings.ranks_listed == 8
    runner = FakeRunner({"sinfo": "".join(f"node{n}|allocated\n" for n in range(1, 9))})
    hooks.start(run, SlurmClient(runner), JOB, env, settings)
    log.write_text(kill_on_bad_exit_step("77", 64, CULPRIT))
    hooks.end(run, 137, SlurmClient(runner), JOB, replace(settings, ranks_per_node=PER_NODE))
    (record,) = attempt_json(run)
    assert record["culprit"] == "rank 5 on node1 killed by SIGKILL"
    assert [c["rank"] for c in record["causes"]][:1] == [CULPRIT]
    assert len(record["causes"]) == len(record["ranks_ended"]) == 8
    assert record["causes_more"] == record["ranks_ended_more"] == 64 - 8
    assert sum(record["ranks_ended_by"]["kind"].values()) == 64
    # The default names every rank of a job below 100 ranks.
    assert hooks.HookSettings().ranks_listed == collect.KEEP_RANKS == 100


def test_an_offset_beyond_the_log_falls_back_to_its_tail(tmp_path) -> None:
    run = committed_run(tmp_path, [20])
    (run / "logs").mkdir()
    log = run / "logs" / "batch-9.out"
    log.write_text("srun: error: node1: task 1: Segmentation fault\n")
    write_attempts(run, [{"attempt": 0, "nodes": "node1", "log_offset": 10**9}])
    step = collect.read_step(run, AttemptId("9", 0, "9"), 0, log)
    assert [(e.rank, e.signal) for e in step.ends] == [(1, "SIGSEGV")]


def test_parsing_grows_linearly_with_the_reports() -> None:
    small = kill_on_bad_exit_step("77", 1600, CULPRIT).splitlines()
    large = kill_on_bad_exit_step("77", 16000, CULPRIT).splitlines()
    assert len(policy.parse_step_lines(large).ends) == 16000
    ratio = cpu_seconds(lambda: policy.parse_step_lines(large)) / cpu_seconds(
        lambda: policy.parse_step_lines(small)
    )
    # 10x the lines: ~10x the time when linear, ~100x when quadratic (0.58 s at 16k before).
    assert ratio < 30, f"16k lines took {ratio:.1f}x the time of 1.6k"


def test_the_lines_stream_to_what_the_whole_text_parses_to() -> None:
    text = (FIXTURES / "srun-deaths.out").read_text()
    assert policy.parse_step_lines(iter(text.splitlines(keepends=True))) == (
        policy.parse_step_log(text)
    )


def test_ranks_of_the_teardown_make_no_node_a_suspect() -> None:
    log = policy.parse_step_log(kill_on_bad_exit_step("77", 64, CULPRIT))
    assert policy.torn_down(log) == frozenset(range(64)) - {CULPRIT}
    # A lone kill in the teardown, the others collateral (raised): it may be the peer the
    # others lost, so it stays a suspect.
    lone = policy.parse_step_log(
        "srun: error: node1: task 0: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=9.0\n"
        "srun: error: node1: task 1: Killed\n"
        "srun: error: node2: task 2: Exited with exit code 1\n"
    )
    assert policy.torn_down(lone, recorded={0, 2}) == frozenset()
    assert policy.torn_down(lone, recorded={0}) == frozenset({2})


def _slurm_at_scale(port: int) -> FakeRunner:
    states = "".join(f"node{n}|allocated\n" for n in range(1, NODES + 1))

    def addresses(argv: tuple[str, ...]) -> CommandResult:
        # scontrol's line per node (tests/fixtures/slurm-22.05/scontrol-show-nodes.txt).
        asked = argv[-1].split(",")
        shown = "".join(f"NodeName={n} NodeAddr=127.0.0.1 State=ALLOCATED\n" for n in asked)
        return CommandResult(argv, 0, shown, "")

    return FakeRunner(
        {
            "sinfo": states,
            "scontrol show config": f"SlurmdPort = {port}\n",
            "scontrol show node": addresses,
            "sacct": "77.0|CANCELLED|0:15|node[1-2000]\n",
        }
    )


def test_a_crash_at_2000_nodes_costs_at_most_5_slurm_commands(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    with socket.socket() as server:  # slurmd of every node answers
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        runner = _slurm_at_scale(server.getsockname()[1])
        run, _ = started_run(tmp_path, runner)
        runner.calls.clear()
        nodes = expand_hostlist(NODELIST)
        settings = Blame(PER_NODE, 24.0)
        ending = failed_ending(run, nodes, JOB, 0, SlurmClient(runner), settings)
    assert ending.cause == "crash" and ending.blamed == ()
    assert ending.record["culprit"] == "rank 5 on node1 killed by SIGKILL"
    assert [c[:3] for c in runner.calls] == [
        ["sinfo", "-h", "-N"],
        ["scontrol", "show", "config"],
        ["scontrol", "show", "node"],
        ["sacct", "-P", "-n"],
    ]
    # Only the culprit's node was a suspect: the teardown's 15,999 ranks were not.
    assert runner.calls[2] == ["scontrol", "show", "node", "-o", "node1"]


def test_2000_silent_nodes_take_one_address_call_and_parallel_probes(tmp_path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # closed below: every connect is refused
    runner = _slurm_at_scale(port)
    run = committed_run(tmp_path, [20])
    nodes = expand_hostlist(NODELIST)
    blamed, why = blame_nodes(run, nodes, JOB, SlurmClient(runner), PER_NODE)
    assert blamed == sorted(nodes)
    assert why.count("slurmd unreachable at 127.0.0.1") == NODES
    assert [c[:3] for c in runner.calls] == [
        ["sinfo", "-h", "-N"],
        ["scontrol", "show", "config"],
        ["scontrol", "show", "node"],  # the addresses of all 2,000 suspects
    ]


def test_probes_keep_the_addresses_order(tmp_path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        # 127.0.0.2 is loopback too, where nothing listens on the port: refused.
        got = probe_all(["127.0.0.1", "127.0.0.2", "127.0.0.1"], port, 1.0)
    assert got == [True, False, True]


def test_a_failure_record_of_rank_5_spares_its_node_too(tmp_path) -> None:
    """Rank 5 raised (its record), srun's teardown ended the rest: no suspect at all."""
    run = committed_run(tmp_path, [20])
    (run / "failures").mkdir()
    record = {"rank": CULPRIT, "host": "node1", "job_id": "77", "attempt": 0, "time": 1.0}
    record.update(exception="ValueError", message="bad batch")
    (run / "failures" / "rank-5.json").write_text(json.dumps(record))
    text = kill_on_bad_exit_step("77", RANKS, CULPRIT).replace(
        ": Killed\n", ": Exited with exit code 1\n", 1
    )
    step = policy.parse_step_log(text)
    runner = _slurm_at_scale(1)
    blamed, _ = blame_nodes(
        run, expand_hostlist(NODELIST), JOB, SlurmClient(runner), PER_NODE, step
    )
    assert blamed == []
    assert [c[0] for c in runner.calls] == ["sinfo"]
