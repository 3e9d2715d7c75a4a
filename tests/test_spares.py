"""Hot spares and elastic shrink without Slurm: which nodes a step runs on, which endings
restart without a blamed node, the end hook's answer and records, the watchdog ending the step
of a dead node, and what the batch script asks of Slurm."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.fakes import FakeRunner
from support.rundirs import attempt_json, committed_run, write_attempts

from ddlaunch.app.prepare import prepare
from ddlaunch.config import ConfigError, load_config
from ddlaunch.job import hooks
from ddlaunch.job.placement import placement_fields
from ddlaunch.job.watchdog import watch
from ddlaunch.job.watches import NodeFailureWatch
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.placement import describe_shortage, place
from ddlaunch.policy.requeue import Ending, History, RetryBudget, decide
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import exclusions
from ddlaunch.store.attempts import AttemptId, AttemptRecord
from ddlaunch.store.watchdog import Verdict, write_verdict

ALLOC = ["node1", "node2", "node3"]


@pytest.mark.parametrize(
    ("unusable", "wanted", "minimum", "expected"),
    [
        ((), 2, None, (("node1", "node2"), ("node3",), False)),  # the spare waits
        (("node2",), 2, None, (("node1", "node3"), (), False)),  # the spare takes over
        (("node1",), 2, None, (("node2", "node3"), (), False)),
        (("node2", "node3"), 2, None, None),  # no spare left, no shrink allowed
        (("node2", "node3"), 2, 1, (("node1",), (), True)),  # shrink to nodes.min
        (("node1", "node2", "node3"), 2, 1, None),
        (("node3",), 3, 2, (("node1", "node2"), (), True)),
        (("node2", "node3"), 3, 2, None),  # fewer than nodes.min
    ],
)
def test_place_takes_the_first_usable_nodes_then_shrinks_to_the_minimum(
    unusable, wanted, minimum, expected
) -> None:
    found = place(ALLOC, unusable, wanted, minimum)
    got = None if found is None else (found.nodes, found.spares, found.shrunk)
    assert got == expected


def test_a_shortage_is_said_with_the_nodes_left_out() -> None:
    assert describe_shortage(ALLOC, ["node2", "node3"], 2, None) == (
        "1 usable node of the allocation's 3 (without node2,node3), 2 needed (nodes.count)"
    )
    assert describe_shortage(ALLOC, ["node1", "node2", "node3"], 2, 1) == (
        "0 usable nodes of the allocation's 3 (without node1,node2,node3), 1 needed (nodes.min)"
    )


@pytest.mark.parametrize(
    ("cause", "replaceable", "now", "expected"),
    [
        (
            "node failure",
            True,
            60,
            (
                "restart",
                "restart in the allocation after node failure: committed step 40 -> 60, "
                "without node2 (restart 1 of 3)",
            ),
        ),
        (
            "node failure",
            False,
            60,
            ("requeue", "requeue after node failure: committed step 40 -> 60, without node2"),
        ),
        # The dead node failed, not the code: retried without it even with no progress.
        (
            "node failure",
            True,
            40,
            (
                "restart",
                "restart in the allocation after node failure: committed step 40 -> 40, "
                "without node2 (restart 1 of 3)",
            ),
        ),
        # Preflight runs before any step: excluding the node is what makes the retry sound.
        (
            "preflight",
            True,
            40,
            (
                "restart",
                "restart in the allocation after preflight, without node2 (restart 1 of 3)",
            ),
        ),
        ("preflight", False, 40, ("requeue", "requeue after preflight, without node2")),
        (
            "straggler",
            True,
            40,
            (
                "restart",
                "restart in the allocation after straggler: committed step 40 -> 40, "
                "without node2 (restart 1 of 3)",
            ),
        ),
    ],
)
def test_a_blamed_node_restarts_in_the_allocation_only_where_it_can_be_replaced(
    cause, replaceable, now, expected
) -> None:
    d = decide(
        Ending(cause, now, blamed=("node2",)), RetryBudget(3, 3, replaceable), History(40, 0, 0)
    )
    kind = "restart" if d.restart else "requeue" if d.requeue else "stop"
    assert (kind, d.reason) == expected


# Recorded from the dev cluster (trimmed): `scontrol show job -o 9` of a running job.
RUNNING_9 = "JobId=9 JobName=ft JobState=RUNNING Reason=None Restarts=0 BatchFlag=1"
SPARE = hooks.HookSettings(ranks_per_node=2, nodes=2, spare_nodes=1)
ENV = {"SLURM_JOB_NODELIST": "node[1-3]", "DDLAUNCH_STEP_NODELIST": "node1,node2"}


def _dead_node_run(tmp_path: Path) -> Path:
    """An attempt on node1,node2 (node3 spare) whose step the watchdog ended: node2 died."""
    run = committed_run(tmp_path, [20, 40, 60])
    record = {"attempt": 0, "job_id": "9", "restart_count": 0, "nodes": "node1,node2"}
    write_attempts(run, [{**record, "resumed_from": 40, "start": 1.0}])
    verdict = Verdict(cause="node failure", nodes=("node2",), detail="node2 slurmd unreachable")
    write_verdict(run, AttemptId("9", 0, "9"), verdict)
    return run


def _slurm(states: str) -> FakeRunner:
    return FakeRunner({"sinfo": states, "scontrol show job": RUNNING_9, "sacct": ""})


def test_end_hook_restarts_on_the_spare_after_a_dead_node(tmp_path: Path) -> None:
    run = _dead_node_run(tmp_path)
    runner = _slurm("node1|allocated\nnode2|allocated*\nnode3|allocated\n")
    client = SlurmClient(runner)
    code = hooks.end(run, 137, client, AttemptId("9", 0, "9"), SPARE, True, ENV)
    assert code == hooks.RESTART_EXIT
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    record = attempt_json(run)[0]
    assert (record["cause"], record["blamed"]) == ("node failure", ["node2"])
    assert record["decision"] == (
        "restart in the allocation after node failure: committed step 40 -> 60, without node2 "
        "(restart 1 of 3)"
    )
    assert exclusions.excluded(run) == ["node2"]
    assert not (run / "outcome.json").exists()


def test_without_a_usable_spare_the_dead_node_means_a_requeue(tmp_path: Path) -> None:
    # The spare is down too: no step of two nodes is left in the allocation.
    run = _dead_node_run(tmp_path)
    runner = _slurm("node1|allocated\nnode2|allocated*\nnode3|down*\n")
    code = hooks.end(run, 137, SlurmClient(runner), AttemptId("9", 0, "9"), SPARE, True, ENV)
    assert code == 0 and runner.calls[-1] == ["scontrol", "requeue", "9"]
    assert attempt_json(run)[0]["decision"] == (
        "requeue after node failure: committed step 40 -> 60, without node2"
    )


def test_a_job_without_spares_requeues_as_before(tmp_path: Path) -> None:
    run = _dead_node_run(tmp_path)
    plain = hooks.HookSettings(ranks_per_node=2, nodes=2)
    runner = _slurm("node1|allocated\nnode2|allocated*\nnode3|idle\n")
    code = hooks.end(run, 137, SlurmClient(runner), AttemptId("9", 0, "9"), plain, True, ENV)
    assert code == 0 and runner.calls[-1] == ["scontrol", "requeue", "9"]


def test_the_start_hook_records_the_step_its_spares_and_a_shrink(tmp_path: Path) -> None:
    run = committed_run(tmp_path, [20])
    exclusions.add_excluded(run, ["node2"], "node failure")
    shrink = hooks.HookSettings(ranks_per_node=2, nodes=2, min_nodes=1)
    env = {"SLURM_JOB_NODELIST": "node[1-2]", "DDLAUNCH_STEP_NODELIST": "node1"}
    runner = FakeRunner({"sinfo": "node1|allocated\nnode2|down*\n"})
    hooks.start(run, SlurmClient(runner), AttemptId("9", 0, "9", 1), env, shrink)
    (record,) = attempt_json(run)
    assert record["nodes"] == "node1" and record["allocation"] == "node[1-2]"
    assert record["spares"] == [] and record["world_size"] == 2
    assert record["shrunk"] == (
        "1 of 2 nodes (nodes.min=1), world size 2 instead of 4: the global batch changes"
    )
    fields = placement_fields(run, ENV, "node1,node3", 2, None, 2)
    assert fields["spares"] == [] and "shrunk" not in fields  # node2 is out, not a spare


def test_the_place_hook_prints_the_next_step_for_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddlaunch.job.placement import print_placement

    run = committed_run(tmp_path, [])
    exclusions.add_excluded(run, ["node2"], "node failure")
    client = SlurmClient(FakeRunner({"sinfo": "node1|allocated\nnode2|down*\nnode3|allocated\n"}))
    assert print_placement(run, ENV, client, 2, None) == 0
    assert capsys.readouterr().out == "node1,node3 2 -\n"
    exclusions.add_excluded(run, ["node3"], "preflight")
    assert print_placement(run, ENV, client, 2, None) == 1
    assert capsys.readouterr().err == (
        "[ddlaunch] no placement for the ranks: 1 usable node of the allocation's 3 "
        "(without node2,node3), 2 needed (nodes.count)\n"
    )


def _node2_died(run_dir: Path, now: float) -> FakeRunner:
    """Job 7's ranks 0-1 (node1) failed 5 s ago; node2's slurmd refuses connections (a port
    bound and closed again), as a dead node's does; Slurm still says both are mixed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failures = run_dir / "failures"
    failures.mkdir()
    for rank in (0, 1):
        (failures / f"rank-{rank}.json").write_text(
            json.dumps({"rank": rank, "job_id": "7", "attempt": 0, "time": now - 5})
        )
    out = f"SlurmdPort = {port}\nNodeName=node2 NodeAddr=127.0.0.1\n"
    return FakeRunner(
        {
            "sinfo": CommandResult(("sinfo",), 0, "node1|mixed\nnode2|mixed\n", ""),
            "scontrol": CommandResult(("scontrol",), 0, out, ""),
            "squeue": CommandResult(("squeue",), 0, "7.0\n", ""),
        }
    )


def _watch_node2_dying(
    tmp_path: Path, *, in_process: bool
) -> tuple[analysis.Finding | None, int | None]:
    """The watchdog of a job with a spare over a step (``sleep 60`` for srun) whose node2
    died: its finding, and srun's exit status once it was over (None: still running)."""
    now = time.time()
    runner = _node2_died(tmp_path, now)
    srun = subprocess.Popen(["sleep", "60"])
    attempt = AttemptId("7", 0, "7")
    nodes = NodeFailureWatch(tmp_path, attempt, now - 60, 2, "node[1-2]", act=True)
    try:
        finding = watch(
            tmp_path,
            attempt=attempt,
            thresholds=analysis.Thresholds(600, 10, 2.0, 300),
            expected_ranks=4,
            srun_pid=srun.pid,
            client=SlurmClient(runner),
            max_polls=3,
            sleep=lambda s: None,
            nodes=nodes,
            in_process=in_process,
        )
        try:
            ended: int | None = srun.wait(timeout=10 if not in_process else 0.5)
        except subprocess.TimeoutExpired:
            ended = None
    finally:
        srun.kill()
        srun.wait()
    return finding, ended


def test_the_watchdog_ends_the_step_of_a_dead_node_at_once_where_a_spare_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    finding, ended = _watch_node2_dying(tmp_path, in_process=False)
    assert ended == -9  # srun killed: the script goes on at once
    assert finding is not None and (finding.cause, finding.nodes) == ("node failure", ("node2",))
    verdict = json.loads((tmp_path / "health" / "verdict-7-0.json").read_text())
    assert (verdict["cause"], verdict["nodes"]) == ("node failure", ["node2"])
    said = capsys.readouterr().out
    assert "[ddlaunch watchdog] node failure: node2 slurmd unreachable at 127.0.0.1" in said
    assert (
        "[ddlaunch watchdog] ended the step without waiting for node2; the end hook decides what "
        "follows"
    ) in said


def test_the_watchdog_leaves_a_step_whose_dead_nodes_ranks_moved_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fault_tolerance.restart: in_process: the first survivor excluded node2 as it moved
    its ranks to a spare's standbys; the watchdog, finding node2 dead, leaves srun running."""
    exclusions.add_excluded(tmp_path, ["node2"], "node failure: every rank died")
    finding, ended = _watch_node2_dying(tmp_path, in_process=True)
    assert ended is None  # still running
    assert finding is None
    assert not (tmp_path / "health" / "verdict-7-0.json").exists()
    said = capsys.readouterr().out
    assert (
        "[ddlaunch watchdog] node failure: node2 slurmd unreachable at 127.0.0.1"
    ) in said and said.rstrip().endswith("its ranks moved to a spare in process")


def _config(tmp_path: Path, **sections: dict) -> Path:
    cfg: dict = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": "sp", "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 2},
        "launch": {"entrypoint": "ddlaunch.examples.mlp:main"},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / "sp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_spares_allocate_more_nodes_with_no_kill_and_place_each_step(tmp_path: Path) -> None:
    spare = prepare(_config(tmp_path, fault_tolerance={"spare_nodes": 1}), run_root=str(tmp_path))
    script = spare.script
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --no-kill\n" in script
    assert "placement=$(python3 -m ddlaunch.job.hooks place)" in script
    assert "\npython3 -m ddlaunch.job.hooks guard &\n" in script
    assert '--overlap --nodes="$step_nodes" --ntasks="$DDLAUNCH_WORLD_SIZE"' in script
    assert "export DDLAUNCH_WORLD_SIZE=$((step_nodes * 2))" in script
    plain = prepare(_config(tmp_path), run_root=str(tmp_path)).script
    assert "#SBATCH --nodes=2\n" in plain
    assert "--no-kill" not in plain and "--overlap" not in plain and "hooks place" not in plain
    assert "hooks guard" not in plain
    shrink = prepare(_config(tmp_path, nodes={"min": 1}), run_root=str(tmp_path)).script
    assert "#SBATCH --nodes=2\n" in shrink and "#SBATCH --no-kill\n" in shrink


def test_nodes_min_above_the_count_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, nodes={"min": 3}))
    assert "nodes.min: is 3, more than nodes.count=2" in str(err.value)


_OK = {"checks": [{"name": "gpus", "status": "ok", "detail": "2"}]}
_FULL = {"checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "0.00 GB free"}]}


def _spare_step(run_dir: Path, attempt: AttemptId, reports: dict[str, dict]) -> FakeRunner:
    """A runner whose srun 'runs' the spares' node tasks by writing their reports."""
    from ddlaunch.store import preflight as records

    def on_run(argv: list[str]) -> None:
        if argv[0] == "srun":
            for host, rep in reports.items():
                records.write_report(run_dir, attempt, host, {"host": host, **rep}, spare=True)

    return FakeRunner(on_run=on_run)


def test_a_spare_that_fails_the_preflight_is_left_out_before_it_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.job.preflight import check_spares
    from ddlaunch.store import badnodes

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "377", 0)
    runner = _spare_step(run_dir, attempt, {"node3": _OK, "node4": _FULL})
    assert check_spares(run_dir, SlurmClient(runner), attempt, ["node3", "node4"]) == ["node4"]
    (srun,) = [c for c in runner.calls if c[0] == "srun"]
    assert "--nodelist=node3,node4" in srun and srun[-1] == "--spare"
    assert exclusions.excluded(run_dir) == ["node4"]
    assert badnodes.active_nodes(tmp_path / "bad.json") == ["node4"]
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("[ddlaunch preflight spare node3] ok; bandwidth: ")
    assert said[1].startswith("[ddlaunch preflight spare node4] disk:checkpoints: 0.00 GB free")
    assert said[2] == (
        "[ddlaunch] preflight failed on a spare: node4: disk:checkpoints: 0.00 GB free; left out"
    )
    # The next placement takes the good spare only.
    found = place(["node1", "node2", "node3", "node4"], exclusions.excluded(run_dir), 2, None)
    assert found is not None and found.spares == ("node3",)


def test_a_spare_reports_local_checks_only_beside_the_training_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.store import preflight as records
    from ddlaunch.worker import node_task

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "377", 0)
    env = {"DDLAUNCH_RUN_DIR": str(run_dir), "SLURM_JOB_ID": "377", "SLURM_RESTART_COUNT": "0"}
    monkeypatch.setattr(node_task, "local_checks", lambda *a: ([], {"torch": {"error": None}}))
    report = node_task.run(env, FakeRunner(), spare=True)
    assert report["net"] == {"skipped": "hot spare: local checks only"}
    assert list(records.read_reports(run_dir, attempt, spare=True)) == [report["host"]]
    assert records.read_reports(run_dir, attempt) == {}  # the ranks' gate never sees it


def test_a_node_that_fails_the_preflight_is_replaced_by_the_spare_in_the_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.store import preflight as records

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "9", 0)
    record = {"attempt": 0, "job_id": "9", "restart_count": 0, "nodes": "node1,node2"}
    write_attempts(run_dir, [{**record, "resumed_from": None, "start": 1.0}])
    for host, rep in {"node1": _OK, "node2": _FULL}.items():
        records.write_report(run_dir, attempt, host, {"host": host, **rep})
    runner = _slurm("node1|allocated\nnode2|allocated\nnode3|allocated\n")
    code = hooks.end(run_dir, 1, SlurmClient(runner), attempt, SPARE, True, ENV)
    assert code == hooks.RESTART_EXIT
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)
    (rec,) = attempt_json(run_dir)
    assert (rec["cause"], rec["blamed"]) == ("preflight", ["node2"])
    assert rec["decision"] == (
        "restart in the allocation after preflight, without node2 (restart 1 of 3)"
    )


def test_status_and_report_say_a_shrink() -> None:
    from types import SimpleNamespace

    from ddlaunch.app import report
    from ddlaunch.app.status import attempt_history
    from ddlaunch.cli.status import attempt_lines

    shrunk = "1 of 2 nodes (nodes.min=1), world size 2 instead of 4: the global batch changes"
    records = [
        {"attempt": 0, "job_id": "9", "nodes": "node1,node2", "start": 0.0, "end": 20.0,
         "cause": "node failure", "blamed": ["node2"], "committed_step": 60},
        {"attempt": 1, "job_id": "9", "nodes": "node1", "start": 21.0, "end": 70.0,
         "relaunch": 1, "in_allocation": True, "shrunk": shrunk, "cause": "completed",
         "resumed_from": 60, "committed_step": 300},
    ]  # fmt: skip
    records = [AttemptRecord.from_json(r) for r in records]
    history = attempt_history(SimpleNamespace(attempts=records, failures=[]), "COMPLETED")  # type: ignore[arg-type]
    lines = [line.split(" at ")[0] for line in attempt_lines(SimpleNamespace(history=history))]
    assert lines == [
        "attempt 0: job 9 on node1,node2",
        f"attempt 1: job 9 (restart in the allocation) (shrunk: {shrunk}) on node1",
    ]
    t = report.build("r", "COMPLETED", records, [], [], [])
    assert t.attempts[1].how == f"9 (restart in the allocation) (shrunk: {shrunk})"
    assert "(shrunk: 1 of 2 nodes" in report.html_page(t, "")


def test_the_guard_requeues_the_job_once_slurm_removes_its_batch_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--no-kill keeps a job whose batch host died (RUNNING until its time limit, measured):
    the guard on another node requeues it, without that node, once Slurm removed the node
    from the job; a node that only stopped answering for a while (``mixed*``, still in the
    job's NodeList) is left alone."""
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.job.guard import watch_batch_host
    from ddlaunch.store import badnodes

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "9", 0)
    write_attempts(run_dir, [{"attempt": 0, "job_id": "9", "nodes": "node1", "start": 1.0}])
    # Recorded on the dev cluster (22.05): squeue of the job before and after Slurm removed
    # its failed batch host; sinfo meanwhile says mixed* (not responding), never down.
    rows = iter(
        ["9|RUNNING|None|node[1-2]\n", "9|RUNNING|None|node[1-2]\n", "9|RUNNING|None|node2\n"]
    )
    runner = FakeRunner(
        {
            "squeue": lambda argv: CommandResult(argv, 0, next(rows), ""),
            "sinfo": "node1|mixed*\n",
        }
    )
    client = SlurmClient(runner)
    assert watch_batch_host(run_dir, client, attempt, "node1", 24.0, sleep=lambda s: None)
    assert runner.count("squeue") == 3
    scontrol = [c for c in runner.calls if c[0] == "scontrol"]
    assert scontrol == [
        ["scontrol", "show", "job", "-o", "9"],  # what the job excludes already: none known
        ["scontrol", "update", "JobId=9", "ExcNodeList=node1"],
        ["scontrol", "requeue", "9"],
    ]
    assert exclusions.excluded(run_dir) == ["node1"]
    assert badnodes.active_nodes(tmp_path / "bad.json") == ["node1"]
    why = "batch host node1 removed from the job by Slurm (NodeList=node2)"
    (rec,) = attempt_json(run_dir)
    assert rec["guard"] == f"requeued by ddlaunch's guard: {why}"
    assert capsys.readouterr().out == (
        "[ddlaunch guard] watching batch host node1\n"
        f"[ddlaunch guard] {why}: requeueing the job without it\n"
    )
    # The start hook of the requeued job closes the cut-off attempt with the guard's words.
    restart = FakeRunner({"sinfo": "node1|down*\nnode2|idle\n"})
    hooks.start(run_dir, SlurmClient(restart), AttemptId("9", 1, "9"), {}, hooks.HookSettings())
    first = attempt_json(run_dir)[0]
    assert (first["cause"], first["blamed"]) == ("requeued by Slurm", ["node1"])
    assert first["decision"] == f"requeued by ddlaunch's guard: {why}"


def test_the_guard_requeues_when_slurm_declares_the_batch_host_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.job.guard import watch_batch_host

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "9", 0)
    runner = FakeRunner({"squeue": "9|RUNNING|None|node[1-2]\n", "sinfo": "node1|down*\n"})
    assert watch_batch_host(run_dir, SlurmClient(runner), attempt, "node1", 24.0)
    assert ["scontrol", "requeue", "9"] in runner.calls


def test_the_guard_stops_the_run_when_no_requeue_could_start_without_the_batch_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 nodes and a spare on a 3-node partition: without its lost batch host the job needs
    3 of 2 usable nodes and would pend for good (BadConstraints). The guard concludes the
    attempt with that node failure and the numbers, and ends the job instead."""
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.job.guard import watch_batch_host
    from ddlaunch.store import outcome

    run_dir = example_run_dir(
        tmp_path, "job.partition=lane0", "nodes.count=2", "fault_tolerance.spare_nodes=1"
    )
    attempt = in_attempt(monkeypatch, tmp_path, "9", 0)
    write_attempts(run_dir, [{"attempt": 0, "job_id": "9", "nodes": "node[2-4]", "start": 1.0}])
    lane = "".join(f"node{i}|lane0|gpu:4|8|infinite|1-infinite\n" for i in (2, 3, 4))
    runner = FakeRunner(
        {"squeue": "9|RUNNING|None|node[2-4]\n", "sinfo": "node4|down*\n", "sinfo -h -a": lane}
    )
    assert watch_batch_host(run_dir, SlurmClient(runner), attempt, "node4", 24.0)
    assert ["scontrol", "requeue", "9"] not in runner.calls
    assert runner.calls[-1] == ["scancel", "9"]
    assert sum(1 for c in runner.calls if c[:3] == ["sinfo", "-h", "-a"]) == 1
    why = (
        "stopped: the requeue without node4 needs 3 nodes (nodes.count 2 + "
        "fault_tolerance.spare_nodes 1); partition lane0 has 2 usable (3 nodes with 2 GPUs "
        "or more, 1 excluded), so it could never start"
    )
    (rec,) = attempt_json(run_dir)
    assert (rec["cause"], rec["decision"], rec["blamed"]) == ("node failure", why, ["node4"])
    assert rec["dead_why"] == "batch host node4 down*" and "end" in rec
    recorded = outcome.read_outcome(run_dir)
    assert recorded is not None and (recorded.state, recorded.reason) == ("FAILED", why)
    assert f"[ddlaunch guard] FAILED: {why}\n" in capsys.readouterr().out


def test_the_guard_of_a_cancelled_run_does_not_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.rundirs import example_run_dir, in_attempt

    from ddlaunch.job.guard import watch_batch_host
    from ddlaunch.store.outcome import CANCEL_FILE

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "9", 0)
    (run_dir / CANCEL_FILE).write_text("{}")
    runner = FakeRunner({"sinfo": "node1|down\n"})
    assert watch_batch_host(run_dir, SlurmClient(runner), attempt, "node1", 24.0)
    assert not any(c[0] == "scontrol" for c in runner.calls)


def test_the_guard_runs_beside_the_ranks_and_outlives_their_steps() -> None:
    from ddlaunch.job.guard import guard_argv, guard_node
    from ddlaunch.slurm.queue import parse_steps

    assert guard_node(["node1", "node2", "node3"], "node1") == "node3"
    assert guard_node(["node1"], "node1") is None
    argv = guard_argv("/usr/bin/python3", "node3", "node1", Path("/r/logs"))
    assert argv[:6] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                        "--nodelist=node3"]  # fmt: skip
    assert "--job-name=ddlaunch-guard" in argv and argv[-2:] == ["--batch-host", "node1"]
    # Ending the training steps (the watchdog) leaves the guard's step running.
    assert parse_steps("9.0|python3\n9.1|ddlaunch-guard\n9.batch|batch\n9.2|python3\n") == [
        "9.0",
        "9.2",
    ]
    assert parse_steps("9.0\n9.extern\n") == ["9.0"]


def test_a_node_the_watchdog_saw_die_is_blamed_after_slurms_requeue_even_once_back(
    tmp_path: Path,
) -> None:
    """Without spares the watchdog only says a node died; Slurm requeues at DOWN. If the node
    is back (slurmd restarted) when the next attempt starts, Slurm's state no longer shows
    it: the watchdog's finding, kept in the attempt, still blames it."""
    from ddlaunch.store import badnodes

    run = committed_run(tmp_path, [20, 40])
    record = {"attempt": 0, "job_id": "7", "restart_count": 0, "nodes": "node[1-2]"}
    write_attempts(run, [{**record, "resumed_from": None, "start": 1.0}])
    now = time.time()
    runner = _node2_died(run, now)
    attempt = AttemptId("7", 0, "7")
    nodes = NodeFailureWatch(run, attempt, now - 60, 2, "node[1-2]")
    watch(
        run,
        attempt=attempt,
        thresholds=analysis.Thresholds(600, 10, 2.0, 300),
        expected_ranks=4,
        srun_pid=None,
        client=SlurmClient(runner),
        max_polls=2,
        sleep=lambda s: None,
        nodes=nodes,
    )
    (opened,) = attempt_json(run)
    assert opened["dead_nodes"] == ["node2"] and "end" not in opened
    # Slurm requeued the job; node2 is back (mixed) when the next attempt starts.
    back = FakeRunner({"sinfo": "node1|mixed\nnode2|mixed\n"})
    hooks.start(run, SlurmClient(back), AttemptId("7", 1, "7"), {}, hooks.HookSettings())
    first = attempt_json(run)[0]
    assert (first["cause"], first["blamed"]) == ("requeued by Slurm", ["node2"])
    assert exclusions.excluded(run) == ["node2"]
    assert badnodes.active_nodes(Path(os.environ["DDLAUNCH_BAD_NODES"])) == ["node2"]
