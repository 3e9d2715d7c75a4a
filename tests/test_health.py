"""Node health, pure layer and adapters with injected fakes: verdicts, heartbeat analysis,
requeue policy, bad-node list, heartbeats, watchdog, preflight hook, report, doctor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from devcluster import run_ddlaunch

from ddlaunch import attempts
from ddlaunch.health import analysis, badnodes, doctor, hooks, policy, preflight, timeline
from ddlaunch.health import verdicts as v
from ddlaunch.health.verdicts import Status
from ddlaunch.health.watchdog import watch
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.worker.heartbeat import Heartbeat, describe_stack, read_heartbeats

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm-22.05"


class FakeRunner:
    """Replays canned results by argv[0] (and records every call)."""

    def __init__(self, answers: dict[str, CommandResult] | None = None, on_run=None):
        self.calls: list[list[str]] = []
        self.answers = answers or {}
        self.on_run = on_run

    def run(self, argv, *, input=None, env=None, cwd=None, timeout=None) -> CommandResult:
        self.calls.append(list(argv))
        if self.on_run is not None:
            got = self.on_run(list(argv))
            if got is not None:
                return got
        return self.answers.get(argv[0], CommandResult(tuple(argv), 0, "", ""))


# ------------------------------------------------------------------ verdicts


def test_gpu_check() -> None:
    assert v.gpu_check(0, None, None).status == Status.OK
    assert v.gpu_check(4, 4, None).status == Status.OK
    assert "nvidia-smi absent" in v.gpu_check(4, 4, None).detail
    assert v.gpu_check(4, 3, None).status == Status.FAIL
    assert v.gpu_check(4, 4, 3).detail == "nvidia-smi lists 3 GPUs, requested 4"
    assert v.gpu_check(4, None, None).status == Status.FAIL
    assert v.gpu_check(4, 4, None, "Unable to determine the device handle").status == Status.FAIL


def test_disk_and_torch_checks() -> None:
    assert v.disk_check("checkpoints", "/c", 5.0, 1.0).status == Status.OK
    failed = v.disk_check("checkpoints", "/c", 0.2, 1.0)
    assert failed.status == Status.FAIL and "needs 1 (health.min_free_gb)" in failed.detail
    assert v.disk_check("scratch", "/s", None, 1.0, "No such file").status == Status.FAIL
    assert v.torch_check(None, "ModuleNotFoundError: torch").status == Status.FAIL
    assert v.torch_check("2.3", None, 1.5).detail == "torch 2.3 imported in 1.5 s"


def test_bandwidth_floor_follows_backend_and_fabric() -> None:
    assert v.bandwidth_floor(None, "nccl", "ib") == 100.0
    assert v.bandwidth_floor(None, "gloo", "ib") == v.GLOO_FLOOR_GBPS
    assert v.bandwidth_floor(3.0, "nccl", "ib") == 3.0


def test_one_slow_node_among_five_is_blamed_not_its_neighbours() -> None:
    order = ["n1", "n2", "n3", "n4", "n5"]
    # n3 is slow: its own exchange and both neighbours' (n2 sends to it, n4 receives from it).
    ring = {"n1": 40.0, "n2": 3.0, "n3": 2.0, "n4": 3.0, "n5": 40.0}
    checks = v.bandwidth_checks(ring, 5.0, 10.0, order)
    assert checks["n3"].status == Status.FAIL
    assert checks["n2"].status == checks["n4"].status == Status.WARN
    assert checks["n1"].status == Status.OK


def test_slow_allocation_is_a_warning_not_an_exclusion() -> None:
    checks = v.bandwidth_checks({"a": 1.0, "b": 1.0}, 1.0, 10.0, ["a", "b"])
    assert {c.status for c in checks.values()} == {Status.WARN}
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 2}, 2.0, 10.0, list("abcd"))
    assert {c.status for c in checks.values()} == {Status.WARN}  # the fabric, not a node
    # Three slow measurements around one node is the pattern of that one node being bad.
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 50}, 2.0, 10.0, list("abcd"))
    assert [n for n, c in checks.items() if c.status == Status.FAIL] == ["b"]


def test_join_reports_and_decide() -> None:
    ok = {"checks": [{"name": "gpus", "status": "ok", "detail": "4"}], "net": {"ring_gbps": 5.0}}
    bad = {
        "checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "0 GB"}],
        "net": {"ring_gbps": 5.0},
    }
    results = v.join_reports(["n1", "n2", "n3"], {"n1": ok, "n2": bad}, 0.2)
    assert [r.ok for r in results] == [True, False, False]
    assert "no preflight report" in results[2].reason()
    d = v.decide(results)
    assert d.exclude == ("n2", "n3") and not d.stop
    everyone = v.decide(v.join_reports(["n1", "n2"], {"n1": bad, "n2": bad}, 0.2))
    assert everyone.stop and everyone.exclude == ()
    single = v.decide(v.join_reports(["n1"], {"n1": bad}, 0.2))
    assert single.exclude == ("n1",) and not single.stop
    assert v.summary_line(v.verdicts_as_dict(results)) == (
        "1 ok, 2 failed (n2: disk:checkpoints, n3: report)"
    )


# ------------------------------------------------------------------ heartbeat analysis

T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=5, straggler_factor=2.0, straggler_patience=30
)


def beat(rank, host, step, step_wall, beat_t, **kw) -> analysis.Beat:
    return analysis.Beat(rank=rank, host=host, step=step, step_wall=step_wall, beat=beat_t, **kw)


def test_no_hang_within_timeout() -> None:
    beats = [beat(0, "a", 10, 1000.0, 1040.0), beat(1, "b", 10, 1000.0, 1040.0)]
    assert analysis.detect_hang(beats, 1050.0, T) is None


def test_hang_blames_the_rank_outside_any_collective() -> None:
    beats = [
        beat(0, "a", 40, 1000.0, 1099.0, waiting=True, where="torch/autograd/__init__.py:1"),
        beat(1, "a", 40, 1000.0, 1099.0, waiting=True),
        beat(2, "b", 40, 1000.0, 1099.0, waiting=False, where="train.py:12 in step"),
        beat(3, "b", 40, 1000.0, 1099.0, waiting=True),
    ]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.cause == "hang"
    assert finding.nodes == ("b",) and finding.ranks == (2,)
    assert "train.py:12" in finding.detail


def test_hang_blames_a_frozen_process_first() -> None:
    beats = [
        beat(0, "a", 40, 1000.0, 1099.0, waiting=True),
        beat(1, "b", 40, 1000.0, 1010.0),  # its writer thread stopped 90 s ago: SIGSTOP
    ]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == ("b",)
    assert "frozen" in finding.detail


def test_hang_blames_ranks_behind_the_others() -> None:
    beats = [beat(0, "a", 41, 1000.0, 1099.0), beat(1, "b", 40, 990.0, 1099.0)]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == ("b",)


def test_hang_without_a_culprit_blames_nobody() -> None:
    beats = [beat(r, h, 40, 1000.0, 1099.0, waiting=True) for r, h in enumerate("aabb")]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == () and "no single node" in finding.detail


def test_closed_ranks_are_not_hung() -> None:
    beats = [beat(0, "a", 100, 1000.0, 1001.0, state="closed")]
    assert analysis.detect_hang(beats, 5000.0, T) is None


def test_straggler_needs_patience() -> None:
    def beats_at() -> list[analysis.Beat]:
        return [
            beat(0, "a", 5, 999.0, 999.0, busy_time=0.10),
            beat(1, "b", 5, 999.0, 999.0, busy_time=0.11),
            beat(2, "c", 5, 999.0, 999.0, busy_time=0.35),
        ]

    state = analysis.StragglerState()
    assert analysis.detect_straggler(beats_at(), 1000.0, T, state) is None
    assert state.slow_since == {"c": 1000.0}
    finding = analysis.detect_straggler(beats_at(), 1031.0, T, state)
    assert finding is not None and finding.cause == "straggler" and finding.nodes == ("c",)
    assert "3.3x" in finding.detail
    # Back to normal: forgotten.
    fast = [beat(r, h, 6, 1040.0, 1040.0, busy_time=0.1) for r, h in enumerate("abc")]
    assert analysis.detect_straggler(fast, 1040.0, T, state) is None and not state.slow_since


def test_current_beats_ignore_other_attempts() -> None:
    recs = [
        {"rank": 0, "host": "a", "job_id": "7", "restart": 1, "beat": 1.0},
        {"rank": 1, "host": "a", "job_id": "7", "restart": 0, "beat": 1.0},
    ]
    assert [b.rank for b in analysis.current_beats(recs, "7", 1)] == [0]


# ------------------------------------------------------------------ policy


def test_policy_preflight_requeues_without_progress_but_within_the_cap() -> None:
    d = policy.decide(
        cause="preflight",
        blamed=["n2"],
        committed_now=None,
        resumed_from=None,
        requeues_so_far=0,
        max_requeues=3,
    )
    assert d.requeue and d.reason == "requeue after preflight, without n2"
    capped = policy.decide(
        cause="preflight",
        blamed=["n2"],
        committed_now=None,
        resumed_from=None,
        requeues_so_far=3,
        max_requeues=3,
    )
    assert not capped.requeue


def test_policy_hang_without_blame_needs_progress() -> None:
    d = policy.decide(
        cause="hang",
        blamed=[],
        committed_now=40,
        resumed_from=40,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert not d.requeue and "no progress" in d.reason
    d = policy.decide(
        cause="hang",
        blamed=["n1"],
        committed_now=40,
        resumed_from=40,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert d.requeue and d.reason.endswith("without n1")
    same = policy.decide(
        cause="crash",
        blamed=[],
        committed_now=40,
        resumed_from=20,
        requeues_so_far=1,
        max_requeues=3,
    )
    assert same == attempts.decide(
        cause="crash", committed_now=40, resumed_from=20, requeues_so_far=1, max_requeues=3
    )


# ------------------------------------------------------------------ bad-node list


def test_bad_node_list_add_expire_remove(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    entries = badnodes.add([], ["n1", "n2"], reason="ib down", now=100.0, ttl_s=50.0)
    entries = badnodes.add(entries, ["n3"], reason="forever", now=100.0, ttl_s=None)
    badnodes.save(entries, path)
    loaded = badnodes.load(path)
    assert [e.node for e in badnodes.active(loaded, 120.0)] == ["n1", "n2", "n3"]
    assert [e.node for e in badnodes.active(loaded, 151.0)] == ["n3"]
    assert badnodes.active_nodes(path, now=151.0) == ["n3"]
    assert [e.node for e in badnodes.remove(loaded, ["n1"])] == ["n2", "n3"]
    refreshed = badnodes.add(loaded, ["n1"], reason="again", now=200.0, ttl_s=10.0)
    assert [(e.node, e.reason) for e in refreshed] == [("n1", "again"), ("n3", "forever")]
    (tmp_path / "junk.json").write_text('[{"reason": "no node"}, 3, {"node": "ok"}]')
    assert [e.node for e in badnodes.load(tmp_path / "junk.json")] == ["ok"]


def test_parse_ttl() -> None:
    assert badnodes.parse_ttl("30m") == 1800
    assert badnodes.parse_ttl("2d") == 172800
    assert badnodes.parse_ttl("never") is None
    with pytest.raises(ValueError):
        badnodes.parse_ttl("soon")


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_ddlaunch(*args, cwd=cwd, env=env)


def test_nodes_cli_and_submit_applies_the_list(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad.json"),
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
    }
    assert (
        _cli(
            "nodes",
            "add",
            "node[2-3]",
            "--reason",
            "ecc errors",
            "--ttl",
            "2h",
            env=env,
            cwd=tmp_path,
        ).returncode
        == 0
    )
    listed = json.loads(_cli("nodes", "list", "--json", env=env, cwd=tmp_path).stdout)
    assert [e["node"] for e in listed] == ["node2", "node3"]
    assert listed[0]["reason"] == "ecc errors"
    dry = _cli("submit", "examples/mlp", "--dry-run", env=env, cwd=REPO)
    assert "#SBATCH --exclude=node2,node3" in dry.stdout
    assert "bad-node list" in dry.stderr
    pinned = _cli(
        "submit", "examples/mlp", "--dry-run", "--set", "nodes.nodelist=[node3]", env=env, cwd=REPO
    )
    assert "#SBATCH --exclude=node2\n" in pinned.stdout  # asked for by name: kept
    assert _cli("nodes", "remove", "node2", env=env, cwd=tmp_path).returncode == 0
    bad = _cli("nodes", "add", "node;rm", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "must be" in bad.stderr
    assert "cleared 1 entry" in _cli("nodes", "clear", env=env, cwd=tmp_path).stdout


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_records_step_time_and_busy_time(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, 3, interval=60, host="h1", job_id="9", restart=2)
    hb.step(1)
    time.sleep(0.02)
    hb.step(2, wait_s=0.01)
    hb.write()
    (rec,) = read_heartbeats(tmp_path)
    assert (rec["rank"], rec["host"], rec["job_id"], rec["restart"], rec["step"]) == (
        3,
        "h1",
        "9",
        2,
        2,
    )
    assert rec["step_time"] >= 0.02 and rec["busy_time"] == pytest.approx(
        rec["step_time"] - 0.01, abs=1e-6
    )
    assert "where" not in rec  # stepping recently: no stack captured
    hb.stop("closed")
    assert read_heartbeats(tmp_path)[0]["state"] == "closed"
    assert list(tmp_path.joinpath("health", "heartbeat").iterdir()) == [hb.path]


def test_describe_stack_tells_waiting_from_stuck() -> None:
    frames: dict[str, object] = {}
    ready = threading.Event()

    def stuck() -> None:
        frames["stuck"] = sys._getframe()
        ready.set()
        time.sleep(0.2)

    t = threading.Thread(target=stuck)
    t.start()
    ready.wait()
    where, waiting = describe_stack(frames["stuck"])
    t.join()
    assert where.endswith("in stuck") and waiting is False


# ------------------------------------------------------------------ watchdog


def _write_beat(run_dir: Path, **rec) -> None:
    d = run_dir / "health" / "heartbeat"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))


def test_watchdog_writes_the_verdict_and_ends_the_step(tmp_path: Path) -> None:
    steps = (FIXTURES / "squeue-steps.txt").read_text()
    runner = FakeRunner({"squeue": CommandResult(("squeue",), 0, steps, "")})
    now = 5000.0
    for rank, (host, waiting) in enumerate([("a", True), ("b", False)]):
        _write_beat(
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
        job_id="377",
        restart=1,
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


def test_watchdog_is_inert_without_heartbeats(tmp_path: Path) -> None:
    from ddlaunch.health.watchdog import watch

    runner = FakeRunner()
    assert (
        watch(
            tmp_path,
            job_id="1",
            restart=0,
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


# ------------------------------------------------------------------ preflight


def test_injection_matches_node_index_and_restart() -> None:
    spec = json.dumps([{"index": 1, "restart": 0, "free_gb": 0}, {"node": "n3", "gpus": 1}])
    assert preflight.injection(spec, "n2", 1, 0) == {"free_gb": 0}
    assert preflight.injection(spec, "n2", 1, 1) == {}
    assert preflight.injection(spec, "n3", 2, 5) == {"gpus": 1}
    assert preflight.injection("not json", "n", 0, 0) == {}


def test_assigned_gpus() -> None:
    assert preflight.assigned_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert preflight.assigned_gpus({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == 0
    assert preflight.assigned_gpus({"SLURM_JOB_GPUS": "2,3,4"}) == 3
    assert preflight.assigned_gpus({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert preflight.assigned_gpus({}) is None


def _in_attempt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, job_id: str, restart: int) -> None:
    """The environment of a batch-script hook in attempt ``restart`` of job ``job_id``."""
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))


def _run_dir(tmp_path: Path, **health) -> Path:
    from ddlaunch.config.validate import to_plain
    from ddlaunch.prepare import prepare

    cfg = prepare(
        "examples/mlp",
        [f"health.{k}={val}" for k, val in health.items()],
        run_id="r",
        run_root=str(tmp_path),
        workdir=str(tmp_path),
    ).config
    run_dir = tmp_path / "r"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    return run_dir


def test_local_checks_with_injected_faults(tmp_path: Path) -> None:
    from ddlaunch.config import load_config

    run_dir = _run_dir(tmp_path)
    cfg = load_config(run_dir / "config.yaml")
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "DDLAUNCH_SCRATCH": str(tmp_path)}
    checks, facts = preflight.local_checks(
        cfg, run_dir, env, FakeRunner(), {"free_gb": 0.5, "gpus": 1, "torch_error": "boom"}
    )
    by = {c.name: c for c in checks}
    assert by["gpus"].status == Status.FAIL
    assert by["disk:checkpoints"].status == by["disk:scratch"].status == Status.FAIL
    assert by["torch"].detail == "import torch failed: boom"
    assert facts["gpus"]["assigned"] == 1


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
            d = preflight.reports_dir(run_dir, job, 0)
            d.mkdir(parents=True, exist_ok=True)
            for host, rep in reports.items():
                (d / f"{host}.json").write_text(json.dumps({"host": host, **rep}))
        return None

    return FakeRunner(on_run=on_run)


def test_preflight_hook_excludes_and_requeues_then_sets_the_exclusion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _run_dir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "377")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    attempts.save(run_dir, [{"attempt": 0, "job_id": "377", "nodes": "node[1-2]", "start": 1.0}])
    ok = {
        "checks": [{"name": "gpus", "status": "ok", "detail": "2"}],
        "net": {"ring_gbps": 4.0, "allreduce_gbps": 3.0, "backend": "gloo"},
    }
    full = {
        "checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "0.00 GB free"}],
        "net": {"ring_gbps": 4.0, "backend": "gloo"},
    }
    runner = _fake_preflight(run_dir, "377", {"node1": ok, "node2": full})
    assert hooks.preflight_hook(run_dir, SlurmClient(runner)) == hooks.REQUEUED
    names = [c[:2] for c in runner.calls]
    # Refused on the running job; so requeue first, then exclude on the pending job.
    assert names.count(["scontrol", "update"]) == 2
    assert names.index(["scontrol", "requeue"]) < len(names) - 1
    assert runner.calls[-1] == ["scontrol", "update", "JobId=377", "ExcNodeList=node2"]
    srun = next(c for c in runner.calls if c[0] == "srun")
    assert "--ntasks-per-node=1" in srun and "ddlaunch.health.preflight" in srun
    (rec,) = attempts.load(run_dir)
    assert rec["cause"] == "preflight" and rec["blamed"] == ["node2"]
    assert [p["ok"] for p in rec["preflight"]] == [True, False]
    assert json.loads((run_dir / "excluded_nodes.json").read_text()) == ["node2"]
    assert badnodes.active_nodes(tmp_path / "bad.json") == ["node2"]


def test_preflight_hook_stops_when_every_node_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _run_dir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    attempts.save(run_dir, [{"attempt": 0, "job_id": "5", "nodes": "node[1-2]", "start": 1.0}])
    full = {"checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "full"}]}
    runner = _fake_preflight(run_dir, "5", {"node1": full, "node2": full})
    assert hooks.preflight_hook(run_dir, SlurmClient(runner)) == hooks.STOPPED
    assert json.loads((run_dir / "outcome.json").read_text())["state"] == "FAILED"
    assert not any(c[:2] == ["scontrol", "requeue"] for c in runner.calls)


def test_preflight_off_runs_nothing(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, preflight="false")
    runner = FakeRunner()
    assert hooks.preflight_hook(run_dir, SlurmClient(runner)) == 0 and runner.calls == []


_OK_REPORT = {
    "checks": [{"name": "gpus", "status": "ok", "detail": "2"}],
    "net": {"ring_gbps": 4.0, "allreduce_gbps": 3.0, "backend": "gloo"},
}


def _in_rank_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports: dict[str, dict], gate: dict | None
) -> tuple[Path, FakeRunner]:
    """Attempt 0 of job 377 on node[1-2] after its ranks ran the preflight gate: node reports
    on disk, the gate record (or none: the ranks ended before the verdict)."""
    from ddlaunch.health import gate as gate_mod

    run_dir = _run_dir(tmp_path)
    _in_attempt(monkeypatch, tmp_path, "377", 0)
    attempts.save(
        run_dir,
        [{"attempt": 0, "job_id": "377", "nodes": "node[1-2]", "start": 1.0, "restart_count": 0}],
    )
    d = preflight.reports_dir(run_dir, "377", 0)
    d.mkdir(parents=True)
    for host, rep in reports.items():
        (d / f"{host}.json").write_text(json.dumps({"host": host, **rep}))
    if gate is not None:
        gate_mod.gate_path(run_dir, "377", 0).write_text(
            json.dumps({"job_id": "377", "restart": 0, **gate})
        )
    return run_dir, _fake_preflight(run_dir, "377", {})


def test_end_hook_excludes_the_node_that_failed_the_gate_and_requeues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddlaunch import jobhooks

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
    assert jobhooks.end(run_dir, 75, SlurmClient(runner), max_requeues=3) == 0
    (rec,) = attempts.load(run_dir)
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
    from ddlaunch import jobhooks

    run_dir, runner = _in_rank_preflight(tmp_path, monkeypatch, {"node1": _OK_REPORT}, None)
    assert jobhooks.end(run_dir, 1, SlurmClient(runner), max_requeues=3) == 0
    (rec,) = attempts.load(run_dir)
    assert rec["cause"] == "preflight" and rec["blamed"] == ["node2"]
    assert [p["ok"] for p in rec["preflight"]] == [True, False]
    latest = json.loads((run_dir / "health" / "preflight.json").read_text())
    assert latest["job_id"] == "377" and "no preflight report" in latest["decision"]


def test_end_hook_treats_a_crash_after_a_passed_gate_as_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch import jobhooks

    run_dir, runner = _in_rank_preflight(
        tmp_path,
        monkeypatch,
        {"node1": _OK_REPORT, "node2": _OK_REPORT},
        {"passed": True, "reason": "every node passed", "printed": True},
    )
    assert jobhooks.end(run_dir, 1, SlurmClient(runner), max_requeues=3) == 1
    (rec,) = attempts.load(run_dir)
    assert rec["cause"] == "crash" and not any(
        c[:2] == ["scontrol", "requeue"] for c in runner.calls
    )


def test_gate_fails_every_rank_before_training_and_records_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank, one node whose checkpoint directory is full: the gate records the verdict,
    the attempt's preflight and the gate record, then raises instead of training."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from ddlaunch.config import load_config
    from ddlaunch.health import gate
    from ddlaunch.worker.distenv import from_environ

    run_dir = _run_dir(tmp_path)
    env = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "41",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_TASKS_PER_NODE": "1",
        "DDLAUNCH_MASTER_PORT": str(29000 + os.getpid() % 1000),
        gate.preflight.INJECT_VAR: json.dumps([{"index": 0, "free_gb": 0}]),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    d = from_environ(env)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(d.master_port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    attempts.save(run_dir, [{"attempt": 0, "job_id": "41", "nodes": "node1", "restart_count": 0}])
    cfg = load_config(run_dir / "config.yaml")
    assert gate.enabled(cfg, env)
    report = gate.node_phase(cfg, run_dir, d, env, "node1")
    gate.import_torch(run_dir, env, report)
    try:
        with pytest.raises(gate.PreflightFailed) as failed:
            gate.check(cfg, run_dir, d, env, report, "gloo", keep_group=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert failed.value.code == gate.GATE_EXIT and "disk:checkpoints" in failed.value.reason
    record = gate.read_gate(run_dir, "41", 0)
    assert record is not None and record["passed"] is False
    (rec,) = attempts.load(run_dir)
    assert rec["preflight"] == [
        {"node": "node1", "ok": False, "reason": rec["preflight"][0]["reason"]}
    ]
    on_disk = json.loads((preflight.reports_dir(run_dir, "41", 0) / "node1.json").read_text())
    assert on_disk["net"]["skipped"] and on_disk["facts"]["torch"]["version"]


def test_end_hook_consumes_the_watchdog_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch import jobhooks
    from ddlaunch.health.watchdog import verdict_path

    run_dir = _run_dir(tmp_path)
    _in_attempt(monkeypatch, tmp_path, "9", 1)
    attempts.save(
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
    verdict_path(run_dir, "9", 1).parent.mkdir(parents=True, exist_ok=True)
    verdict_path(run_dir, "9", 1).write_text(
        json.dumps({"cause": "hang", "nodes": ["node2"], "detail": "rank(s) 1 stuck"})
    )
    sinfo = CommandResult(("sinfo",), 0, "node2|mixed\n", "")
    runner = FakeRunner({"sinfo": sinfo})
    assert jobhooks.end(run_dir, 137, SlurmClient(runner), max_requeues=3) == 0
    rec = attempts.load(run_dir)[-1]
    assert rec["cause"] == "hang" and rec["blamed"] == ["node2"]
    assert rec["health"] == "rank(s) 1 stuck"
    assert ["scontrol", "update", "JobId=9", "ExcNodeList=node2"] in runner.calls


# ------------------------------------------------------------------ report and doctor


def test_timeline_and_html() -> None:
    t = timeline.build(
        "r1",
        "COMPLETED",
        [
            {
                "attempt": 0,
                "job_id": "5",
                "nodes": "n1",
                "start": 0.0,
                "end": 30.0,
                "cause": "preflight",
                "blamed": ["n1"],
                "health": "gpus: 1 of 2",
            },
            {
                "attempt": 1,
                "job_id": "5",
                "nodes": "n2",
                "start": 40.0,
                "end": 400.0,
                "cause": "completed",
                "committed_step": 100,
            },
        ],
        [(20, 100.0), (40, 200.0)],
        [{"time": 150.0, "rank": 1, "host": "n2", "exception": "ValueError"}],
        [{"time": 60.0, "step": 0}, {"time": 160.0, "step": 50}, {"time": 260.0, "step": 100}],
        excluded=["n1"],
    )
    assert timeline.throughput(t.samples) == [(160.0, 0.5), (260.0, 0.5)]
    page = timeline.html_page(t, "AAAA")
    assert "data:image/png;base64,AAAA" in page and "preflight" in page and "n1" in page
    assert [e.kind for e in t.events] == ["checkpoint", "failure", "checkpoint"]


def test_report_draws_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.cli.report import draw

    t = timeline.build(
        "r1",
        "RUNNING",
        [{"attempt": 0, "nodes": "n1", "start": 0.0}],
        [],
        [],
        [{"time": 0.0, "step": 0}, {"time": 60.0, "step": 30}],
        now=90.0,
    )
    draw(t, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_doctor_script_is_valid_bash() -> None:
    directives = [
        ("--job-name", "x"),
        ("--nodes", "2"),
        ("--ntasks-per-node", "4"),
        ("--signal", "USR2@120"),
        ("--requeue", None),
        ("--exclude", "n9"),
        ("--gpus-per-node", "4"),
    ]
    out = doctor.doctor_directives(directives, nodes=None, nodelist=["n1", "n2", "n3"], minutes=4)
    assert ("--nodes", "3") in out and ("--nodelist", "n1,n2,n3") in out
    assert all(f not in ("--signal", "--requeue", "--exclude") for f, _ in out)
    script = doctor.doctor_script(
        out, "/runs/doc 1", [("NCCL_X", "a b")], ["module load x"], "python3"
    )
    assert "export DDLAUNCH_RUN_DIR='/runs/doc 1'" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_doctor_rows_join_fabric_findings_and_unchecked() -> None:
    ok = {
        "checks": [{"name": "gpus", "status": "ok", "detail": "4 listed"}],
        "net": {"ring_gbps": 90.0, "allreduce_gbps": 80.0, "backend": "nccl"},
        "fabric": [
            {"check": "rdma.mlx5_0", "status": "mismatch", "detail": "port down"},
            {"check": "topology.gpus", "status": "unchecked", "detail": "no nvidia-smi"},
        ],
    }
    results = v.join_reports(["n1", "n2"], {"n1": ok, "n2": {**ok, "fabric": []}}, 50.0)
    rows = doctor.verdict_rows(results, {"n1": ok, "n2": {**ok, "fabric": []}})
    assert [r.verdict for r in rows] == ["MISMATCH", "ok"]
    assert rows[0].fabric == ["rdma.mlx5_0: mismatch (port down)"]
    assert rows[0].unchecked == ["topology.gpus: no nvidia-smi"]
    assert rows[1].checks["gpus"] == "4 listed"


def test_preempt_signal_during_preflight_is_kept_and_relayed(tmp_path: Path) -> None:
    import signal

    saved = signal.getsignal(signal.SIGUSR2)
    try:
        received = preflight.catch_preempt_signal({"SUBMITIT_PREEMPT_SIGNAL": "USR2"})
        os.kill(os.getpid(), signal.SIGUSR2)  # would end the task with the default action
        time.sleep(0.05)
        assert received == ["SIGUSR2"]
    finally:
        signal.signal(signal.SIGUSR2, saved)
    hooks.defer_signal(tmp_path, {"n1": {"signal": "SIGUSR2"}, "n2": {}})
    runner = FakeRunner()
    _write_beat(
        tmp_path,
        rank=0,
        host="n1",
        job_id="",
        restart=0,
        step=1,
        step_wall=1.0,
        beat=1.0,
        started=1.0,
        state="running",
    )
    from ddlaunch.health.watchdog import relay_deferred_signal

    relay_deferred_signal(tmp_path, "", 0, SlurmClient(runner))
    assert runner.calls == [["scancel", "--signal=USR2", ""]]
    relay_deferred_signal(tmp_path, "", 0, SlurmClient(runner))  # once only
    assert len(runner.calls) == 1


def test_watchdog_names_a_node_that_died_under_the_attempt_and_leaves_srun_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """node2's ranks vanished; node1's failed (connection closed) and srun waits for node2:
    the watchdog probes slurmd (refused) and says so at once, but neither ends srun nor
    requeues: Slurm requeues when it declares the node down (NodeFailureWatch says why)."""
    import socket

    from ddlaunch.health.watchdog import NodeFailureWatch

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
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
    nodes = NodeFailureWatch(tmp_path, 0, now - 60, 2, "node[1-2]")
    try:
        watch(
            tmp_path,
            job_id="7",
            restart=0,
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

    from ddlaunch.health.watchdog import NodeFailureWatch

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    failures = tmp_path / "failures"
    failures.mkdir()
    (failures / "rank-0.json").write_text(
        json.dumps({"rank": 0, "attempt": 0, "time": time.time() - 5})
    )
    out = f"SlurmdPort = {server.getsockname()[1]}\nNodeName=n NodeAddr=127.0.0.1\n"
    runner = FakeRunner(
        {
            "sinfo": CommandResult(("sinfo",), 0, "node1|mixed\nnode2|mixed\n", ""),
            "scontrol": CommandResult(("scontrol",), 0, out, ""),
        }
    )
    try:
        nodes = NodeFailureWatch(tmp_path, 0, 0.0, 1, "node[1-2]")
        watch(
            tmp_path,
            job_id="7",
            restart=0,
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
