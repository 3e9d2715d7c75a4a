"""The in-process restart on the real dev cluster (``fault_tolerance.restart: in_process``):
what was kept, not only that it ran.

The example MLP (2 nodes x 2 ranks, gloo, 120 steps, a checkpoint every 20); its data
depends only on the global step, so a run restarted in process must end with parameters
bit-identical to an uninterrupted one (the reference: 4 local ranks, the same code path).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import processes, wait_for
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import attempts, committed, mlp_config, nodes_that_may_die, result, submit

from ddlaunch.config import load_config
from ddlaunch.config.validate import to_plain
from ddlaunch.store.heartbeats import read_heartbeats

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

IN_PROCESS = {"restart": "in_process", "checkpoint_every_steps": 20, "keep_last": 0}
# Killed at a committed step >= 60: 60 steps are left to train after the restart.
PARAMS = {"steps": 120, "step_sleep": 0.15}


@pytest.fixture(scope="session")
def reference_sha(tmp_path_factory: pytest.TempPathFactory) -> str:
    from ddlaunch.launch.local import run_local

    tmp = tmp_path_factory.mktemp("reference")
    cfg = load_config(mlp_config(tmp, "reference", params={"steps": PARAMS["steps"]}))
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg)))
    run_local(run_dir, cfg.world_size, timeout_s=300)
    return str(json.loads((run_dir / "result.json").read_text())["param_sha256"])


def _pids(run_dir: Path, module: bytes) -> dict[int, int]:
    """{pid: rank} of a run's processes running ``module`` (srun's task id, SLURM_PROCID:
    a standby's is its standby index until it takes a rank)."""
    found = {}
    for pid, argv, env in processes(f"DDLAUNCH_RUN_DIR={run_dir}"):
        if not argv[0].endswith(b"srun") and any(module in arg for arg in argv):
            procid = next((e for e in env if e.startswith(b"SLURM_PROCID=")), b"=-1")
            found[pid] = int(procid.split(b"=")[1])
    return found


def _beat_step(run_dir: Path) -> int:
    """Rank 0's step as its last heartbeat says (-1 before the first)."""
    steps = [b.get("step") for b in read_heartbeats(run_dir) if b.get("rank") == 0]
    return max((s for s in steps if isinstance(s, int)), default=-1)


def test_a_killed_rank_is_replaced_by_a_standby_and_the_others_keep_their_processes(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    # Heartbeats every 0.5 s: the test reads rank 0's step from them.
    config = mlp_config(
        tmp_path,
        "inproc",
        params=PARAMS,
        fault_tolerance=IN_PROCESS,
        health={"heartbeat_interval": 0.5},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    # Killed 10-19 steps past a save (rank 0's heartbeat says 10-13; it lags the step by up
    # to two intervals): the memory point 5 or 10 steps past the save is newer than the disk.
    wait_for(lambda: 10 <= _beat_step(run_dir) % 20 <= 13, 60, "a step past a save", poll=0.05)
    ranks = _pids(run_dir, b"ddlaunch.worker.task")
    standbys = _pids(run_dir, b"ddlaunch.worker.standby")
    assert len(ranks) == 4 and len(standbys) == 2, (ranks, standbys)
    victim = next(pid for pid, rank in ranks.items() if rank == 3)
    on_disk = committed(run_dir)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: (attempts(run_dir)[-1].get("in_process_restarts") or [{}])[-1].get("state_from"),
        60,
        "the in-process restart's record",
        poll=0.1,
    )
    # Training again, in the same processes: every survivor's pid still runs the rank.
    for pid, rank in ranks.items():
        if rank != 3:
            assert b"ddlaunch.worker.task" in Path(f"/proc/{pid}/cmdline").read_bytes(), rank
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    print(f"kill -> completed in {time.monotonic() - killed_at:.1f} s")
    (only,) = attempts(run_dir)  # no process restart, no requeue
    (restart,) = only["in_process_restarts"]
    assert restart["ranks"] == [3] and restart["state_from"] == "ram", restart
    (replacement,) = restart["replacements"]
    assert replacement["pid"] in standbys  # a process that existed before the kill
    assert replacement["rank_pid"] not in standbys  # the process it forked for the rank
    # From a memory point (every 5 steps) newer than the disk's latest checkpoint: fewer
    # steps trained again than since the save.
    assert restart["resumed_from"] > on_disk and restart["resumed_from"] % 5 == 0, on_disk
    assert only["cause"] == "completed"
    res = result(run_dir)
    assert res["param_sha256"] == reference_sha
    # The survivors kept their processes: each of ranks 0-2 wrote its lines under its pid.
    logs = {r: (run_dir / "logs" / f"rank-{r}.out").read_text() for r in range(4)}
    for rank in ranks.values():
        if rank != 3:
            assert "restarting in this process" in logs[rank], logs[rank]
    assert f"(pid {replacement['pid']}) takes rank 3" in logs[3]
    status = ddlaunch("status", run_dir.name, cwd=tmp_path)
    assert "in-process restart 1" in status.stdout, status.stdout


def test_a_replacement_that_dies_as_it_joins_falls_back_to_the_process_restart(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    ft = {**IN_PROCESS, "rejoin_timeout": 10}
    config = mlp_config(tmp_path, "inproc-fb", params=PARAMS, fault_tolerance=ft)
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    ranks = _pids(run_dir, b"ddlaunch.worker.task")
    victim = next(pid for pid, rank in ranks.items() if rank == 3)
    os.kill(victim, signal.SIGKILL)
    logs = run_dir / "logs"

    def taking() -> int | None:
        """The process the standby forked to run rank 3 (``... takes rank 3 (generation 1)
        in pid N``)."""
        for log in logs.glob("standby-*.out"):
            for line in log.read_text().splitlines():
                if "takes rank 3" in line:
                    return int(line.rsplit(" in pid ", 1)[1])
        return None

    os.kill(wait_for(taking, 60, "a standby taking rank 3", poll=0.02), signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first, second = attempts(run_dir)
    (restart,) = first["in_process_restarts"]
    assert restart["ranks"] == [3], restart
    assert restart["fell_back"] == (
        "rank 3 did not join the new process group within fault_tolerance.rejoin_timeout (10 s)"
    )
    assert first["cause"] == "crash" and second["in_allocation"] is True
    assert second["resumed_from"] >= 60
    assert result(run_dir)["param_sha256"] == reference_sha
    said = (logs / "rank-0.out").read_text()
    assert "no in-process restart (" in said and "the ranks restart as new processes" in said


def _parent(pid: int) -> int:
    """A process's parent, from /proc (the rank's own line: ``PPid:``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])


def test_a_second_and_a_third_failure_on_the_same_node_are_restarted_in_process(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """standbys_per_node: 1. Rank 3 on node2 killed -9, then the process that took it, then
    the one that took that: the node's one standby took it each time (it forks the rank and
    waits again), so all three are restarted in process, in one attempt, and the books say
    the node still has its standby."""
    config = mlp_config(tmp_path, "inproc-3x", params=PARAMS, fault_tolerance=IN_PROCESS)
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 180, "a committed step >= 20")
    ranks = _pids(run_dir, b"ddlaunch.worker.task")
    standbys = _pids(run_dir, b"ddlaunch.worker.standby")
    assert len(ranks) == 4 and len(standbys) == 2, (ranks, standbys)
    victim = next(pid for pid, rank in ranks.items() if rank == 3)
    killed = []
    for n in (1, 2, 3):
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)

        def recorded(n: int = n) -> dict | None:
            done = attempts(run_dir)[-1].get("in_process_restarts") or []
            return done[n - 1] if len(done) >= n and done[n - 1].get("state_from") else None

        restart = wait_for(recorded, 60, f"in-process restart {n}'s record", poll=0.1)
        (taken,) = restart["replacements"]
        assert taken["pid"] in standbys and _parent(taken["rank_pid"]) == taken["pid"], taken
        victim = taken["rank_pid"]  # the next failure: the process that runs rank 3 now
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    (only,) = attempts(run_dir)  # no process restart, no requeue
    restarts = only["in_process_restarts"]
    assert [r["generation"] for r in restarts] == [1, 2, 3]
    assert all(r["ranks"] == [3] and r["fell_back"] is None for r in restarts), restarts
    # rank 3's node's one standby took it each time, in a new process each time
    (node,) = {h for r in restarts for h in r["hosts"]}
    assert {r["replacements"][0]["host"] for r in restarts} == {node}
    assert len({r["replacements"][0]["pid"] for r in restarts}) == 1
    rank_pids = [r["replacements"][0]["rank_pid"] for r in restarts]
    assert rank_pids == [*killed[1:], rank_pids[-1]] and len(set(rank_pids)) == 3, rank_pids
    assert only["cause"] == "completed"
    assert result(run_dir)["param_sha256"] == reference_sha
    # The books: one record for the job, the node's standby waiting again, three taken.
    books = json.loads((run_dir / "standbys.json").read_text())
    assert books["taken_count"] == 3 and [t["rank"] for t in books["taken"]] == [3, 3, 3]
    assert sorted((n["host"], n["waiting"]) for n in books["nodes"]) == [
        (n, 1) for n in slurm_cluster.hostnames(only["nodes"])
    ], books


def test_every_original_rank_replaced_in_turn_the_run_completes_in_one_attempt(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """Ranks 0, 1, 2, 3 killed -9 one after another, each taken by its node's standby: once
    the last original task died, the ranks' srun step has ended, yet the ranks the standbys
    forked train on in the standbys' step. The batch script waits for them: one attempt, every
    restart in process, the weights of an uninterrupted run."""
    ft = {**IN_PROCESS, "max_restarts": 4}
    config = mlp_config(tmp_path, "inproc-all", params=PARAMS, fault_tolerance=ft)
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 20, 180, "a committed step >= 20")
    ranks = _pids(run_dir, b"ddlaunch.worker.task")
    assert len(ranks) == 4, ranks
    for n, rank in enumerate((0, 1, 2, 3), start=1):
        os.kill(next(pid for pid, r in ranks.items() if r == rank), signal.SIGKILL)

        def recorded(n: int = n) -> dict | None:
            done = attempts(run_dir)[-1].get("in_process_restarts") or []
            return done[n - 1] if len(done) >= n and done[n - 1].get("state_from") else None

        restart = wait_for(recorded, 60, f"in-process restart {n}'s record", poll=0.1)
        assert restart["ranks"] == [rank], restart
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    (only,) = attempts(run_dir)  # no process restart, no requeue
    restarts = only["in_process_restarts"]
    assert [r["ranks"] for r in restarts] == [[0], [1], [2], [3]], restarts
    assert all(r["fell_back"] is None and r["replacements"] for r in restarts), restarts
    assert only["cause"] == "completed" and only["in_process_done"]
    assert result(run_dir)["param_sha256"] == reference_sha
    # The batch log says the wait, once.
    batch = next((run_dir / "logs").glob("batch-*.out")).read_text()
    (line,) = [x for x in batch.splitlines() if "waited" in x]
    assert "(4 in-process restarts) trained on" in line, line
    assert line.endswith("until the ranks finished"), line


def _on(pid: int, node: str) -> bool:
    return f"SLURMD_NODENAME={node}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(
        b"\0"
    )


def test_a_node_whose_ranks_all_die_moves_to_the_spares_standbys(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """3 nodes allocated, 2 used: every ddlaunch process of the second node killed -9 (its
    ranks and its standby) -> the spare's standbys take both ranks, state from the peers'
    RAM copies on the first node."""
    ft = {**IN_PROCESS, "spare_nodes": 1}
    config = mlp_config(tmp_path, "inproc-spare", params=PARAMS, fault_tolerance=ft)
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    opened = attempts(run_dir)[0]
    used = slurm_cluster.hostnames(opened["nodes"])
    (spare,) = opened["spares"]
    victim = used[1]
    ranks = _pids(run_dir, b"ddlaunch.worker.task")
    standbys = _pids(run_dir, b"ddlaunch.worker.standby")
    assert len(standbys) == 4, standbys  # one per working node, two on the spare
    doomed = [pid for pid in [*ranks, *standbys] if _on(pid, victim)]
    assert len(doomed) == 3, doomed
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    (only,) = attempts(run_dir)
    (restart,) = only["in_process_restarts"]
    assert restart["ranks"] == [2, 3] and restart["state_from"] == "ram", restart
    assert {r["host"] for r in restart["replacements"]} == {spare}
    assert {r["pid"] for r in restart["replacements"]} <= set(standbys)
    assert result(run_dir)["param_sha256"] == reference_sha
    excluded = json.loads((run_dir / "excluded_nodes.json").read_text())
    assert excluded == [victim]


@pytest.mark.lane
@pytest.mark.matrix
def test_a_node_that_dies_moves_to_the_spare_in_process(
    slurm_cluster, slurm_job_cleanup, tmp_path, reference_sha
) -> None:
    """The second working node killed outright (slurmd and every process of it): the
    ranks' and the standbys' steps are --no-kill, so the survivors train on, the spare's
    standbys take its ranks, and the watchdog, finding the dead node, leaves the step."""
    ft = {**IN_PROCESS, "spare_nodes": 1}
    config = mlp_config(
        tmp_path,
        "inproc-node",
        params=PARAMS,
        fault_tolerance=ft,
        nodes=nodes_that_may_die(slurm_cluster),
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 60, 180, "a committed step >= 60")
    opened = attempts(run_dir)[0]
    victim = slurm_cluster.hostnames(opened["nodes"])[1]  # not the batch host
    (spare,) = opened["spares"]
    slurm_cluster.kill_node(victim)
    try:
        assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    finally:
        slurm_cluster.revive_node(victim)
    (only,) = attempts(run_dir)  # no restart with new processes
    (restart,) = only["in_process_restarts"]
    assert restart["ranks"] == [2, 3] and restart["state_from"] == "ram", restart
    assert {r["host"] for r in restart["replacements"]} == {spare}
    assert result(run_dir)["param_sha256"] == reference_sha
    # The watchdog may find the dead node before the run ends (or not, on a short run): if it
    # does, it leaves the step to the ranks that moved.
    batch = next((run_dir / "logs").glob("batch-*.out")).read_text()
    assert "ended the step" not in batch
    said = [line for line in batch.splitlines() if line.startswith("[ddlaunch watchdog]")]
    assert all(line.endswith("its ranks moved to a spare in process") for line in said), said
