"""The preflight seen from the batch host: the end hook after an in-rank preflight (exclude
and requeue, stop, or leave it to the crash handling), and the watchdog's verdict in the end
hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.rundirs import attempt_json, example_run_dir, in_attempt, write_attempts

from ddlaunch.job import hooks
from ddlaunch.job.preflight import preflight_outcome
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import badnodes
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.watchdog import verdict_path

NODES = ["node1", "node2"]
ATTEMPT = AttemptId("377", 0, "377")


def _fake_preflight(run_dir: Path, job: str, reports: dict[str, dict]):
    """A runner whose srun 'runs' the node tasks by writing their reports, and whose Slurm
    refuses ExcNodeList while the job has not been requeued (as 22.05 does)."""
    requeued = []

    def on_run(argv: list[str]):
        if argv[:2] == ["scontrol", "requeue"]:
            requeued.append(True)
        if argv[:2] == ["scontrol", "update"] and not requeued:
            return CommandResult(tuple(argv), 1, "", "Job is no longer pending execution")
        if argv[0] == "srun":
            d = records.reports_dir(run_dir, AttemptId(job, 0, job))
            d.mkdir(parents=True, exist_ok=True)
            for host, rep in reports.items():
                (d / f"{host}.json").write_text(json.dumps({"host": host, **rep}))
        return None

    return FakeRunner(on_run=on_run)


def test_a_staging_source_missing_on_every_node_stops_and_blames_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#31: ``src: /nope`` on a job of one node: not the node's fault, so no exclusion, no
    bad-node entry, no requeue onto the next node; the run stops with the cause."""
    from ddlaunch.policy import staging

    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "6", 0)
    write_attempts(run_dir, [{"attempt": 0, "job_id": "6", "nodes": "node1", "start": 1.0}])
    item = {"name": "train", "src": "/nope", "dst": "/var/tmp/s/node1/data/train-1"}
    item |= {"state": "failed", "error": "FileNotFoundError: /nope: no such file or directory"}
    missing = {"checks": [staging.check([item]).as_dict()], "net": {"skipped": "single node"}}
    # The ranks' gate wrote the node's report and the ranks ended before the verdict.
    reports = records.reports_dir(run_dir, attempt)
    reports.mkdir(parents=True)
    (reports / "node1.json").write_text(json.dumps({"host": "node1", **missing}))
    runner = _fake_preflight(run_dir, "6", {})
    assert preflight_outcome(run_dir, SlurmClient(runner), attempt, ["node1"]) == 1  # stopped
    reason = (
        "preflight failed alike on every node (node1), which no node's exclusion fixes: "
        "staging: train: failed: FileNotFoundError: /nope: no such file or directory"
    )
    assert json.loads((run_dir / "outcome.json").read_text())["reason"] == reason
    assert f"[ddlaunch] preflight: {reason}\n" in capsys.readouterr().out
    assert badnodes.active_nodes(tmp_path / "bad.json") == []
    assert not (run_dir / "excluded_nodes.json").exists()
    (rec,) = attempt_json(run_dir)
    assert not rec.get("blamed") and not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)


_OK_REPORT = {
    "checks": [{"name": "gpus", "status": "ok", "detail": "2"}],
    "net": {"ring_gbps": 4.0, "allreduce_gbps": 3.0, "backend": "gloo"},
}


def _in_rank_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports: dict[str, dict], gate: dict | None
) -> tuple[Path, FakeRunner]:
    """Attempt 0 of job 377 on node[1-2] after its ranks ran the preflight gate: node reports
    on disk, the gate record (or none: the ranks ended before the verdict)."""
    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "377", 0)
    write_attempts(
        run_dir,
        [{"attempt": 0, "job_id": "377", "nodes": "node[1-2]", "start": 1.0, "restart_count": 0}],
    )
    d = records.reports_dir(run_dir, attempt)
    d.mkdir(parents=True)
    for host, rep in reports.items():
        (d / f"{host}.json").write_text(json.dumps({"host": host, **rep}))
    if gate is not None:
        records.gate_path(run_dir, attempt).write_text(
            json.dumps({"job_id": "377", "restart": 0, **gate})
        )
    return run_dir, _fake_preflight(run_dir, "377", {})


def test_end_hook_excludes_the_node_that_failed_the_gate_and_requeues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    full = {
        "checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "0.00 GB free"}],
        "net": {"ring_gbps": 4.0, "backend": "gloo"},
    }
    run_dir, runner = _in_rank_preflight(
        tmp_path,
        monkeypatch,
        {"node1": _OK_REPORT, "node2": full},
        {"passed": False, "reason": "preflight failed: node2: disk:checkpoints: 0.00 GB free"},
    )
    assert hooks.end(run_dir, 75, SlurmClient(runner), ATTEMPT) == 0
    (rec,) = attempt_json(run_dir)
    assert rec["cause"] == "preflight" and rec["blamed"] == ["node2"]
    assert "disk:checkpoints" in rec["health"]
    assert runner.calls[-1] == ["scontrol", "update", "JobId=377", "ExcNodeList=node2"]
    assert ["scontrol", "requeue", "377"] in runner.calls
    assert badnodes.active_nodes(tmp_path / "bad.json") == ["node2"]
    # The verdicts reach the batch log once.
    assert capsys.readouterr().out.count("[ddlaunch preflight node") == 2


def test_end_hook_blames_a_node_that_never_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks ended before the verdict (node2 died or hung before its report): the end hook
    judges from the reports on disk and records the verdicts itself."""
    run_dir, runner = _in_rank_preflight(tmp_path, monkeypatch, {"node1": _OK_REPORT}, None)
    assert hooks.end(run_dir, 1, SlurmClient(runner), ATTEMPT) == 0
    (rec,) = attempt_json(run_dir)
    assert rec["cause"] == "preflight" and rec["blamed"] == ["node2"]
    assert [p["ok"] for p in rec["preflight"]] == [True, False]
    latest = json.loads((run_dir / "health" / "preflight.json").read_text())
    assert latest["job_id"] == "377" and "no preflight report" in latest["decision"]


def test_end_hook_treats_a_crash_after_a_passed_gate_as_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, runner = _in_rank_preflight(
        tmp_path,
        monkeypatch,
        {"node1": _OK_REPORT, "node2": _OK_REPORT},
        {"passed": True, "reason": "every node passed", "printed": True},
    )
    assert hooks.end(run_dir, 1, SlurmClient(runner), ATTEMPT) == 1
    (rec,) = attempt_json(run_dir)
    assert rec["cause"] == "crash" and not any(
        c[:2] == ["scontrol", "requeue"] for c in runner.calls
    )


def test_end_hook_consumes_the_watchdog_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = example_run_dir(tmp_path)
    attempt = in_attempt(monkeypatch, tmp_path, "9", 1)
    write_attempts(
        run_dir,
        [
            {
                "attempt": 0,
                "job_id": "9",
                "nodes": "node1",
                "start": 1.0,
                "end": 2.0,
                "cause": "preflight",
            },
            {"attempt": 1, "job_id": "9", "nodes": "node2", "start": 3.0, "resumed_from": None},
        ],
    )
    verdict_path(run_dir, attempt).parent.mkdir(parents=True, exist_ok=True)
    verdict_path(run_dir, attempt).write_text(
        json.dumps({"cause": "hang", "nodes": ["node2"], "detail": "rank(s) 1 stuck"})
    )
    sinfo = CommandResult(("sinfo",), 0, "node2|mixed\n", "")
    runner = FakeRunner({"sinfo": sinfo})
    assert hooks.end(run_dir, 137, SlurmClient(runner), attempt) == 0
    rec = attempt_json(run_dir)[-1]
    assert rec["cause"] == "hang" and rec["blamed"] == ["node2"]
    assert rec["health"] == "rank(s) 1 stuck"
    assert ["scontrol", "update", "JobId=9", "ExcNodeList=node2"] in runner.calls
