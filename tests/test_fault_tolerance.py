"""End-to-end fault tolerance on the real dev cluster: what was kept, not only that it ran.

Every run trains the example MLP (2 nodes x 2 ranks, gloo) for 300 steps; data depends only
on the global step, so an interrupted-and-resumed run must end with parameters bit-identical
to an uninterrupted one (the reference, trained once per session with the same 4 ranks).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for
from support.slurm_runs import (
    STEPS,
    attempts,
    committed,
    mlp_config,
    nodes_that_may_die,
    result,
    submit,
)

from ddlaunch.checkpoint.layout import list_checkpoints, read_commit_marker
from ddlaunch.config import load_config
from ddlaunch.config.validate import to_plain

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="session")
def reference_sha(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run's final parameters (4 local ranks, same code path)."""
    from ddlaunch.launch.local import run_local

    tmp = tmp_path_factory.mktemp("reference")
    cfg = load_config(mlp_config(tmp, "reference"))
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    run_local(run_dir, cfg.world_size, timeout_s=300)
    return json.loads((run_dir / "result.json").read_text())["param_sha256"]


def progress_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


@pytest.mark.lane
def test_node_kill_requeues_and_ends_bit_identical(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    config = mlp_config(tmp_path, "ft-kill", params={"step_sleep": 0.15})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    # The checkpoint of step 60 committed (the async save of a step commits a few steps later,
    # later still on a loaded machine): the resumed attempt must start from at least there.
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    nodes = slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))
    victim = nodes[1]
    killed_at = time.monotonic()
    slurm_cluster.kill_node(victim)
    try:
        assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    finally:
        slurm_cluster.revive_node(victim)
    print(f"kill -> completed in {time.monotonic() - killed_at:.1f} s")
    runs = attempts(run_dir)
    assert len(runs) == 2, runs
    # Slurm requeues the job when it declares the node down; if srun returned first, the
    # end hook saw the down node itself. Either way the node is blamed and excluded.
    assert runs[0]["cause"] in ("requeued by Slurm", "node failure"), runs
    assert runs[0]["blamed"] == [victim]
    assert victim not in slurm_cluster.hostnames(runs[1]["nodes"])
    resumed = runs[1]["resumed_from"]
    assert resumed is not None and resumed >= 60 and resumed % 20 == 0
    res = result(run_dir)
    assert res["start_step"] == resumed
    assert res["param_sha256"] == reference_sha
    excluded = json.loads((run_dir / "excluded_nodes.json").read_text())
    assert excluded == [victim]


@pytest.mark.lane
def test_a_node_kill_ends_a_run_that_allows_no_requeue(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    """fault_tolerance.max_requeues=0 and no spare: a node that dies ends the run. The job is
    submitted --no-requeue, so Slurm does not requeue it by itself either (it used to, and
    the run trained on in a requeue its policy never allowed)."""
    config = mlp_config(
        tmp_path, "ft-no-requeue", params={"step_sleep": 0.15}, fault_tolerance={"max_requeues": 0}
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 180, "a committed step >= 20")
    victim = slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))[1]
    slurm_cluster.kill_node(victim)
    try:
        seen = job_states_until_done(slurm_cluster, job_id, 300)
    finally:
        slurm_cluster.revive_node(victim)
    # Slurm ended the job for the node failure, with no requeue, by it or by ddlaunch.
    assert seen[0] == "RUNNING" and seen[-1] == "NODE_FAIL" and "PENDING" not in seen, seen
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"
    assert len(attempts(run_dir)) == 1
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert f"node failure of {victim}" in status.stdout, status.stdout
    assert "NODE_FAIL" in status.stdout, status.stdout


def lose_batch_host(cluster, run_dir: Path, job_id: str) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """Kill the node of the run's batch script, follow the job to its end (every state it
    showed), and revive the node whatever happened: ``(host, states)``."""
    host = attempts(run_dir)[0]["batch_host"]
    cluster.kill_node(host)
    try:
        return host, job_states_until_done(cluster, job_id, 400)
    finally:
        cluster.revive_node(host)


def job_states_until_done(cluster, job_id: str, timeout: float) -> list[str]:  # type: ignore[no-untyped-def]
    """Every state the job showed, polled until it ended (a requeue shows PENDING)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.job_state(job_id) or "?"
        if not seen or seen[-1] != state:
            seen.append(state)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still {seen[-1:]} after {timeout} s")


def test_rank_kill_restarts_in_the_allocation_bit_identical(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    config = mlp_config(tmp_path, "ft-restart", params={"step_sleep": 0.15})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    victim = slurm_cluster.rank_pids(run_dir)[-1]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    seen = job_states_until_done(slurm_cluster, job_id, 300)
    print(f"kill -> completed in {time.monotonic() - killed_at:.1f} s; states {seen}")
    assert seen == ["RUNNING", "COMPLETED"] or seen == ["RUNNING", "COMPLETING", "COMPLETED"]
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"  # never requeued
    first, second = attempts(run_dir)
    assert first["cause"] == "crash" and first["decision"].startswith(
        "restart in the allocation after crash: committed step none -> "
    )
    assert second["in_allocation"] is True and second["relaunch"] == 1
    assert second["restart_count"] == 0 and second["job_id"] == first["job_id"] == job_id
    assert second["nodes"] == first["nodes"] and second["restart_cause"] == "crash"
    resumed = second["resumed_from"]
    assert resumed >= 60 and resumed % 20 == 0 and resumed == first["committed_step"]
    res = result(run_dir)
    assert res["start_step"] == resumed
    assert res["param_sha256"] == reference_sha
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert f"attempt 1: job {job_id} (restart in the allocation) on" in status.stdout


def test_crash_loop_restarts_at_most_max_restarts_then_stops(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    config = mlp_config(
        tmp_path,
        "ft-loop",
        entrypoint="launch_entrypoints:mlp_raise_after",
        params={"fail_after": 30},
        fault_tolerance={"async_save": False, "max_restarts": 2, "max_requeues": 0},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    seen = job_states_until_done(slurm_cluster, job_id, 300)
    assert "PENDING" not in seen[1:] and seen[-1] == "FAILED", seen
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"
    runs = attempts(run_dir)
    assert [r["cause"] for r in runs] == ["crash", "crash", "crash"], runs
    assert [r.get("relaunch", 0) for r in runs] == [0, 1, 2]
    # Every attempt made progress (so only the caps stop the loop) and resumed from the last.
    assert [r["resumed_from"] for r in runs] == [None, 20, 40]
    assert [r["committed_step"] for r in runs] == [20, 40, 60]
    reason = (
        "stopped: 2 restarts in the allocation reached fault_tolerance.max_restarts=2, "
        "0 requeues reached fault_tolerance.max_requeues=0"
    )
    assert runs[-1]["decision"] == reason
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["state"], outcome["reason"]) == ("FAILED", reason)


def test_kill_every_rank_during_checkpoint_write(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    config = mlp_config(
        tmp_path,
        "ft-stall",
        entrypoint="launch_entrypoints:mlp_stall_commit",
        params={"stall_step": 100},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    out = run_dir / "out"
    stalled = wait_for(
        lambda: (
            sorted(out.glob("stalled-*.json"))
            if len(list(out.glob("stalled-*.json"))) == 4
            else None
        ),
        180,
        "4 ranks stalled in the commit",
    )
    step_dir = run_dir / "checkpoints" / "step-100"
    assert (step_dir / ".metadata").exists()  # every shard and DCP's metadata are written...
    assert read_commit_marker(step_dir) is None  # ...but it is not committed
    for path in stalled:
        os.kill(json.loads(path.read_text())["pid"], signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    runs = attempts(run_dir)
    assert [r["cause"] for r in runs] == ["crash", "completed"], runs
    assert runs[0]["committed_step"] == 80
    assert runs[1]["resumed_from"] == 80  # the partial step-100 was never loaded
    res = result(run_dir)
    assert res["start_step"] == 80 and res["param_sha256"] == reference_sha
    infos = list_checkpoints(run_dir / "checkpoints")
    assert all(i.complete for i in infos), [(i.step, i.reason) for i in infos if not i.complete]
    assert [i.step for i in infos] == list(range(20, STEPS + 1, 20))


def test_time_limit_signal_saves_on_every_rank_and_resumes(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    # The rendered script asks for --signal=USR2@<lead> (golden renders check it); Slurm
    # delivers it to the step's tasks on a 30 s tick, so the test sends the same signal the
    # same way (to the step tasks, not the batch shell) at a known point instead.
    config = mlp_config(tmp_path, "ft-signal", params={"step_sleep": 0.15})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: progress_step(run_dir) >= 60, 240, "step 60")
    slurm_cluster.signal_job(job_id, "USR2")
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    runs = attempts(run_dir)
    assert [r["cause"] for r in runs] == ["signal", "completed"], runs
    saved = runs[0]["committed_step"]
    assert saved >= 60 and runs[1]["resumed_from"] == saved
    marker = read_commit_marker(run_dir / "checkpoints" / f"step-{saved}")
    assert marker is not None and marker.world_size == 4
    assert marker.num_shard_files == 4  # every rank wrote its shard
    assert marker.metadata.get("reason") == "signal"
    res = result(run_dir)
    assert res["start_step"] == saved
    assert res["param_sha256"] == reference_sha


@pytest.mark.lane
def test_same_failure_every_attempt_stops_without_progress(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    config = mlp_config(
        tmp_path,
        "ft-raise",
        entrypoint="launch_entrypoints:mlp_raise_at",
        params={"fail_at": 50},
        fault_tolerance={"async_save": False},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "FAILED", timeout=300) == "FAILED"
    runs = attempts(run_dir)
    assert [r["cause"] for r in runs] == ["crash", "crash"], runs
    assert runs[1]["in_allocation"] is True  # the retry was a restart in the allocation
    assert [r["resumed_from"] for r in runs] == [None, 40]
    assert [r["committed_step"] for r in runs] == [40, 40]
    status = ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    row = json.loads(status.stdout)[0]
    assert row["state"] == "FAILED"
    assert row["detail"] == (
        "stopped: no progress in the last attempt (the committed step stayed at 40)"
    )
    assert row["attempts"] == 2
    first = slurm_cluster.hostnames(runs[0]["nodes"])[0]
    assert row["failure"].startswith(
        f"rank 1 on {first}: RuntimeError: deterministic failure at step 50"
    )


def test_resume_on_a_different_node_count(slurm_cluster, slurm_job_cleanup, tmp_path) -> None:
    config = mlp_config(tmp_path, "ft-resize", params={"steps": 100})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=240) == "COMPLETED"
    first = result(run_dir)
    proc = ddlaunch(
        "resume", run_dir.name, "--nodes", "1", "--set", "params.steps=160", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"resuming {run_dir.name} from step 100")
    new_job = next(x for x in proc.stdout.splitlines() if x.startswith("run ")).split()[3]
    slurm_job_cleanup.append(new_job)
    assert slurm_cluster.wait_job_state(new_job, "COMPLETED", timeout=240) == "COMPLETED"
    second = result(run_dir)
    assert second["start_step"] == 100 and second["world_size"] == 2
    # The state is restored exactly; only the global batch changes (4 -> 2 ranks), so one
    # step later the loss is within 50 % of where it stopped, and far below the start.
    before, after = first["final_loss"], second["losses"]["100"]
    assert abs(after - before) <= 0.5 * before, (before, after)
    assert after < 0.1 * first["initial_loss"]
    assert second["final_loss"] < 0.05
    # At its last step now (its final checkpoint is params.steps): nothing is submitted.
    done = ddlaunch("resume", run_dir.name, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"error: run {run_dir.name} already reached its last step (160, params.steps=160): "
        f"resuming would train nothing. To train further, raise it: ddlaunch resume "
        f"{run_dir.name} --set params.steps=320\n"
    )


def verdict_time(run_dir: Path, record: dict) -> float:
    """When the watchdog's verdict on an attempt was written (its ``time``)."""
    key = f"{record['job_id']}-{record.get('restart_count', 0)}"
    key += f".{record['relaunch']}" if record.get("relaunch") else ""
    return float(json.loads((run_dir / "health" / f"verdict-{key}.json").read_text())["time"])


@pytest.mark.lane
@pytest.mark.matrix
def test_node_death_continues_on_the_spare_bit_identical(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """3 nodes allocated, 2 used: every process of the second working node killed -9 at step
    >= 60 -> the ranks restart on the first node and the spare, inside the allocation."""
    config = mlp_config(
        tmp_path,
        "ft-spare",
        params={"step_sleep": 0.15},
        fault_tolerance={"spare_nodes": 1},
        nodes=nodes_that_may_die(slurm_cluster),
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    opened = attempts(run_dir)[0]
    used = slurm_cluster.hostnames(opened["nodes"])
    (spare,) = opened["spares"]
    assert len(used) == 2 and spare not in used
    victim = used[1]  # not the batch host: losing that one ends the job
    killed_at = time.time()
    slurm_cluster.kill_node(victim)
    try:
        seen = job_states_until_done(slurm_cluster, job_id, 300)
    finally:
        slurm_cluster.revive_node(victim)
    print(f"kill -> completed in {time.time() - killed_at:.1f} s; states {seen}")
    assert "PENDING" not in seen and seen[-1] == "COMPLETED", seen
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"  # never requeued
    first, second = attempts(run_dir)
    assert first["cause"] == "node failure" and first["blamed"] == [victim], first
    assert first["decision"].startswith("restart in the allocation after node failure"), first
    detected = verdict_time(run_dir, first) - killed_at
    print(f"dead node found {detected:.1f} s after the kill")
    # The watchdog's own budget: the ranks' failure records, then its grace (2 s), the next
    # poll (1 s apart here), one Slurm call and a slurmd connect bounded by its timeout (3 s):
    # about 3 s when the dead node refuses the connect at once, 6 s at worst; Slurm's own
    # SlurmdTimeout would take minutes.
    assert detected <= 2.0 + 1.0 + 3.0 + 0.5
    assert second["in_allocation"] is True and second["restart_cause"] == "node failure"
    assert slurm_cluster.hostnames(second["nodes"]) == [used[0], spare]
    resumed = second["resumed_from"]
    assert resumed >= 60 and resumed % 20 == 0
    res = result(run_dir)
    assert res["start_step"] == resumed
    assert res["param_sha256"] == reference_sha
    assert json.loads((run_dir / "excluded_nodes.json").read_text()) == [victim]
    bad = json.loads(Path(os.environ["DDLAUNCH_BAD_NODES"]).read_text())
    assert victim in json.dumps(bad)
    # The spare passed its own preflight (local checks) while the ranks started.
    log = (run_dir / "logs" / f"batch-{job_id}.out").read_text()
    assert f"[ddlaunch preflight spare {spare}] ok; bandwidth: hot spare: local checks only" in log
    assert f"[ddlaunch] preflight: every spare passed ({spare})" in log


@pytest.mark.lane
def test_node_death_without_a_spare_shrinks_to_nodes_min(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    """2 nodes, nodes.min 1, no spare: the second node killed -9 at step >= 60 -> the ranks
    continue on the first node alone (world size 4 -> 2, resharded from the checkpoint)."""
    config = mlp_config(tmp_path, "ft-shrink", params={"step_sleep": 0.15}, nodes={"min": 1})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    used = slurm_cluster.hostnames(attempts(run_dir)[0]["nodes"])
    victim = used[1]
    slurm_cluster.kill_node(victim)
    try:
        seen = job_states_until_done(slurm_cluster, job_id, 300)
    finally:
        slurm_cluster.revive_node(victim)
    assert "PENDING" not in seen and seen[-1] == "COMPLETED", seen
    first, second = attempts(run_dir)
    assert first["cause"] == "node failure" and first["blamed"] == [victim], first
    assert slurm_cluster.hostnames(second["nodes"]) == [used[0]]
    assert (first["world_size"], second["world_size"]) == (4, 2)
    shrunk = "1 of 2 nodes (nodes.min=1), world size 2 instead of 4: the global batch changes"
    assert second["shrunk"] == shrunk
    res = result(run_dir)
    assert res["start_step"] == second["resumed_from"] >= 60
    assert res["world_size"] == 2 and res["steps"] == STEPS, res
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert (
        f"attempt 1: job {job_id} (restart in the allocation) (shrunk: {shrunk}) on "
        f"{used[0]}" in status.stdout
    ), status.stdout


@pytest.mark.lane
def test_a_node_stopped_shorter_than_the_detection_window_is_not_blamed(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """Every process of a working node SIGSTOPped for 10 s, past the heartbeat window (8 s at
    heartbeat_interval 1) but alive: its slurmd's socket still accepts, so the watchdog,
    which would end the step at once for a dead node (a spare is there), blames nothing."""
    config = mlp_config(
        tmp_path,
        "ft-stall",
        params={"step_sleep": 0.15},
        fault_tolerance={"spare_nodes": 1},
        health={"heartbeat_interval": 1.0},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 40, 180, "a committed step >= 40")
    victim = slurm_cluster.hostnames(attempts(run_dir)[0]["nodes"])[1]
    assert slurm_cluster.signal_node(victim, signal.SIGSTOP) > 0
    try:
        time.sleep(10)
    finally:
        slurm_cluster.signal_node(victim, signal.SIGCONT)
    seen = job_states_until_done(slurm_cluster, job_id, 300)
    assert seen[-1] == "COMPLETED", seen
    (only,) = attempts(run_dir)
    assert only["cause"] == "completed" and not only.get("blamed"), only
    assert not (run_dir / "excluded_nodes.json").exists()
    assert not list((run_dir / "health").glob("verdict-*.json"))
    assert result(run_dir)["param_sha256"] == reference_sha


@pytest.mark.lane
def test_a_node_failing_preflight_is_replaced_by_the_spare_without_a_requeue(
    slurm_cluster, slurm_job_cleanup, tmp_path, monkeypatch
) -> None:
    """The second node's preflight fails (no free space, injected): the ranks restart at once
    on the first node and the spare; the job never goes back to the queue."""
    first_node, victim, third_node = slurm_cluster.nodes[:3]
    monkeypatch.setenv("DDLAUNCH_HEALTH_INJECT", json.dumps([{"node": victim, "free_gb": 0}]))
    config = mlp_config(
        tmp_path,
        "ft-spare-pf",
        params={"steps": 60},
        fault_tolerance={"spare_nodes": 1},
        nodes={"nodelist": [first_node, victim, third_node]},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    seen = job_states_until_done(slurm_cluster, job_id, 300)
    assert "PENDING" not in seen[1:] and seen[-1] == "COMPLETED", seen
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"
    first, second = attempts(run_dir)
    assert (first["cause"], first["blamed"]) == ("preflight", [victim]), first
    assert first["decision"] == (
        f"restart in the allocation after preflight, without {victim} (restart 1 of 3)"
    )
    assert first["committed_step"] is None  # no training step ran
    assert second["nodes"] == f"{first_node},{third_node}" and second["in_allocation"] is True
    assert second["resumed_from"] is None and result(run_dir)["start_step"] == 0


@pytest.mark.lane
def test_losing_the_batch_host_of_a_job_with_spares_falls_back_to_a_requeue(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    """The batch host (the first node, where the batch script runs) dies: Slurm 22.05 keeps
    the --no-kill job RUNNING on its other node with nobody to conclude it, so ddlaunch's
    guard (a one-task step on the spare) requeues it once Slurm declares the node down, and
    it resumes on the nodes left (1 node x 2 ranks and a spare: the requeued job finds its 2
    nodes without the dead one on this 3-node cluster)."""
    config = mlp_config(
        tmp_path,
        "ft-spare-host",
        params={"step_sleep": 0.15},
        nodes={"count": 1},
        fault_tolerance={"spare_nodes": 1},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    host, seen = lose_batch_host(slurm_cluster, run_dir, job_id)
    assert "PENDING" in seen and seen[-1] == "COMPLETED", seen
    runs = attempts(run_dir)
    assert runs[0]["cause"] == "requeued by Slurm" and runs[0]["blamed"] == [host], runs
    assert runs[0]["decision"].startswith(f"requeued by ddlaunch's guard: batch host {host} ")
    assert host not in slurm_cluster.hostnames(runs[-1]["nodes"])
    resumed = runs[-1]["resumed_from"]
    assert resumed >= 60 and result(run_dir)["start_step"] == resumed


@pytest.mark.lane
def test_losing_the_batch_host_where_no_requeue_could_start_ends_the_run(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    """2 nodes and a spare on a 3-node lane, the batch host dies: a requeue without it would
    ask 3 nodes of the 2 left and pend for good (BadConstraints), so the guard ends the run
    with the numbers as its reason, and the attempt keeps its node failure, even after a
    cancel."""
    if len(slurm_cluster.nodes) != 3:
        pytest.skip("the shortage needs a partition of exactly nodes + spare")
    config = mlp_config(
        tmp_path,
        "ft-spare-short",
        params={"step_sleep": 0.15},
        nodes={"count": 2},
        fault_tolerance={"spare_nodes": 1},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 180, "a committed step >= 20")
    host, seen = lose_batch_host(slurm_cluster, run_dir, job_id)
    assert "PENDING" not in seen[1:], seen
    (only,) = attempts(run_dir)
    assert (only["cause"], only["blamed"]) == ("node failure", [host]), only
    reason = only["decision"]
    assert reason.startswith(f"stopped: the requeue without {host} needs 3 nodes"), reason
    assert "has 2 usable" in reason, reason
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert (outcome["state"], outcome["reason"]) == ("FAILED", reason)
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert status.returncode == 0 and reason in " ".join(status.stdout.split()), status.stdout
    cancel = ddlaunch("cancel", run_dir.name, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    (kept,) = attempts(run_dir)
    assert (kept["cause"], kept["decision"]) == ("node failure", reason), kept
