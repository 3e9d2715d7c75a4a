"""``fault_tolerance.mode: replica_groups`` in the ranks, without Slurm: a real torchft
lighthouse and replica groups of real rank processes on loopback, each group started (and
restarted) as the batch host's supervisor starts a group's srun step: its own world, its own
master port, the variables of ``planning.group_env``, through the rank function."""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch.distributed.checkpoint as dcp
from submitit.core.utils import JobPaths
from support.rundirs import loaded_run_dir

from ddlaunch.config import load_config
from ddlaunch.launch.local import _base_env, free_local_port, run_local
from ddlaunch.launch.slurm import rank_call
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.store import groups
from ddlaunch.store.failures import read_failure
from ddlaunch.store.heartbeats import read_heartbeats
from ddlaunch.store.rundir import LOGS_DIR, SUBMITIT_DIR
from ddlaunch.worker import replica
from ddlaunch.worker.distenv import PORT_OVERRIDE_VAR
from ddlaunch.worker.replica import group_identity

torchft = pytest.importorskip("torchft")
from torchft.coordination import LighthouseServer  # noqa: E402

GROUP_SIZE = 2
STEPS = 400
STEP_SLEEP = 0.05
KILL_AT = 40  # group 0's step at which group 1's rank 0 is killed
SCRIPTS = Path(__file__).parent / "trainer_scripts"


def make_run(tmp_path: Path, name: str, *sets: str, **launch: object) -> Path:
    """``<tmp>/<name>``: examples/mlp as two replica groups that log every step and save
    every 100 (these tests' run; ``sets`` and ``launch`` on top)."""
    return loaded_run_dir(
        tmp_path / name,
        "examples/mlp",
        "fault_tolerance.mode=replica_groups",
        "parallel.dp_replicate=2",
        "fault_tolerance.checkpoint_every_steps=100",
        f"params.steps={STEPS}",
        "params.log_every=1",
        *sets,
        **launch,
    )


@dataclasses.dataclass
class Group:
    """One start of a replica group: what a group's srun step is, here."""

    job_id: str
    procs: list[subprocess.Popen[bytes]]


def start_group(
    run: Path,
    lighthouse: str,
    group: int,
    restart: int,
    groups_n: int,
    size: int = GROUP_SIZE,
    start: int = 0,
) -> Group:
    """Start ``size`` ranks of ``group`` (``restart``: the group's restart count, which a
    whole-job start resets; ``start``: tells two whole-job starts' processes apart)."""
    cfg = load_config(run / "config.yaml")
    job_id = f"rg{group}x{restart}s{start}"  # per start: its own submitit result files
    folder = run / SUBMITIT_DIR
    JobPaths(folder, job_id).submitted_pickle.parent.mkdir(parents=True, exist_ok=True)
    JobPaths(folder, job_id).submitted_pickle.write_bytes(cloudpickle.dumps(rank_call(run)))
    env = _base_env(cfg, run, job_id, size)
    env[PORT_OVERRIDE_VAR] = str(free_local_port())  # each group its own world
    identity = GroupIdentity(group, groups_n, lighthouse, group * size, restart)
    env.update(identity.env(manager_port=0))
    procs = []
    for rank in range(size):
        job_rank = group * size + rank
        with (
            open(run / LOGS_DIR / f"rank-{job_rank}.out", "ab") as out,
            open(run / LOGS_DIR / f"rank-{job_rank}.err", "ab") as err,
        ):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-u", "-m", "ddlaunch.worker.task", str(folder)],
                    env={
                        **env,
                        "SUBMITIT_LOCAL_GLOBALID": str(rank),
                        "SUBMITIT_LOCAL_LOCALID": str(rank),
                    },
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
    return Group(job_id, procs)


def result_of(run: Path, group: Group, rank: int) -> dict[str, Any]:
    with open(JobPaths(run / SUBMITIT_DIR, group.job_id, rank).result_pickle, "rb") as handle:
        outcome, value = pickle.load(handle)
    assert outcome == "success", value
    return dict(value["result"])


def wait_all(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


STEP_LINE = re.compile(rb"^\[mlp\] step (\d+)/", re.M)


def last_step(log: Path) -> int:
    """The last step job rank 0 (group 0's rank 0) printed (``params.log_every=1``)."""
    steps = STEP_LINE.findall(log.read_bytes()) if log.exists() else []
    return int(steps[-1]) if steps else 0


def lighthouse(min_replicas: int = 1) -> Any:
    return LighthouseServer(
        bind="[::]:0",
        min_replicas=min_replicas,
        join_timeout_ms=10000,
        quorum_tick_ms=100,
        heartbeat_timeout_ms=1000,
    )


@pytest.mark.alone
@pytest.mark.timeout(240)
def test_a_killed_group_heals_from_its_peer_while_the_other_keeps_training(
    tmp_path: Path,
) -> None:
    # The reference: the same 4 ranks, uninterrupted, in job mode.
    ref_run = make_run(tmp_path, "job", "fault_tolerance.mode=job", "params.log_every=0")
    reference = run_local(ref_run, world_size=2 * GROUP_SIZE, timeout_s=150)[0]["result"]

    run = make_run(tmp_path, "groups", f"params.step_sleep={STEP_SLEEP}")
    server = lighthouse()
    address = server.address()
    try:
        g0 = start_group(run, address, 0, 0, 2)
        g1 = start_group(run, address, 1, 0, 2)
        log0 = run / LOGS_DIR / "rank-0.out"
        deadline = time.monotonic() + 90
        while last_step(log0) < KILL_AT:
            assert time.monotonic() < deadline, "group 0 did not reach the kill step"
            assert all(p.poll() is None for p in g0.procs + g1.procs)
            time.sleep(0.02)
        # Group 1's rank 0 dies, usually inside the next step's compute (params.step_sleep,
        # between backward and the reduce); srun would then end the step's other rank.
        time.sleep(STEP_SLEEP / 2)
        killed_at, step_at_kill = time.monotonic(), last_step(log0)
        os.kill(g1.procs[0].pid, signal.SIGKILL)
        g1.procs[0].wait()
        os.killpg(g1.procs[1].pid, signal.SIGKILL)
        g1.procs[1].wait()
        # The survivors: their step goes on while group 1 is down; the longest wait between
        # two of group 0's steps is the stall the failure cost it.
        seen, stall, last_new = step_at_kill, 0.0, time.monotonic()
        while time.monotonic() - killed_at < 4.0:
            now_step = last_step(log0)
            if now_step > seen:
                stall = max(stall, time.monotonic() - last_new)
                seen, last_new = now_step, time.monotonic()
            time.sleep(0.01)
        stall = max(stall, time.monotonic() - last_new)
        down_steps = seen - step_at_kill
        restarted_at = time.monotonic()
        g1b = start_group(run, address, 1, 1, 2)
        heal_deadline = time.monotonic() + 90
        while groups.read_heal(run, 1, 1) is None:
            assert time.monotonic() < heal_deadline, "group 1 did not heal"
            assert all(p.poll() is None for p in g0.procs + g1b.procs)
            time.sleep(0.02)
        rejoined_at = time.monotonic()
        step_at_rejoin = last_step(log0)
        codes = wait_all(g0.procs + g1b.procs, 120)
    finally:
        server.shutdown()
    reruns = log0.read_text().count("did not commit")
    print(
        f"group 0: {reruns} step(s) run again; "
        f"stall {stall:.2f} s after the kill, {down_steps} steps in the 4 s after it; "
        f"kill -> rejoin {rejoined_at - killed_at:.1f} s (restart -> heal "
        f"{rejoined_at - restarted_at:.1f} s); group 0 at step {step_at_rejoin} then"
    )
    assert codes == [0, 0, 0, 0]
    # Group 0 kept its processes (the same PIDs ended the run) and kept committing steps
    # while group 1 was down: 4 s at ~50 ms a step is ~60 steps; measured ~1 s of stall.
    assert stall < 3.0 and down_steps >= 10, (stall, down_steps)
    heal = groups.read_heal(run, 1, 1)
    assert heal is not None and heal.step_before == 0 and heal.healed_from_step > KILL_AT
    assert heal.healed_from_group == 0  # the only live group, named by its transport
    # Counted from the restarted processes' start: within the restart -> heal time seen here.
    assert 0 < heal.seconds_from_start < rejoined_at - restarted_at + 1.0
    assert "healed from a live peer (group 0)" in (run / LOGS_DIR / "rank-2.out").read_text()
    assert (
        "starting from step"
        not in (run / LOGS_DIR / "rank-2.out")
        .read_text()
        .split("[ddlaunch] rank 2 (group 1", 2)[-1]
    )  # the restart did not read the disk
    results = [result_of(run, g0, r) for r in range(GROUP_SIZE)]
    results += [result_of(run, g1b, r) for r in range(GROUP_SIZE)]
    assert {r["param_sha256"] for r in results} == {results[0]["param_sha256"]}
    assert all(r["steps"] == STEPS for r in results)
    # Each process's start: group 0's from scratch, the restarted group 1's at its heal.
    assert [r["start_step"] for r in results] == [0, 0] + [heal.healed_from_step] * GROUP_SIZE
    assert groups.read_step(run, 0).step == STEPS  # type: ignore[union-attr]
    assert groups.read_step(run, 1).step == STEPS  # type: ignore[union-attr]
    # The job-mode run averages 4 ranks' batches at every step; the groups lost group 1's
    # batches while it was down: the same loss within 5 % (measured: 0.01365 and 0.01372,
    # near the 0.01 noise floor).
    final, ref = results[0]["final_loss"], reference["final_loss"]
    assert math.isclose(final, ref, rel_tol=0.05), (final, ref)
    # One group wrote the checkpoints, the manager's step with them.
    steps = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert steps == ["step-300", "step-400"]  # keep_last 2, every 100 steps
    metadata = dcp.FileSystemReader(str(run / "checkpoints" / "step-400")).read_metadata()
    assert {"torchft.step", "torchft.batches_committed"} <= set(metadata.state_dict_metadata)
    # Job-wide ranks in the records: no two groups share a heartbeat or failure name.
    beats = read_heartbeats(run)
    assert {b["rank"] for b in beats} >= {0, 1, 2, 3}


def run_group_only(tmp_path: Path, name: str) -> tuple[Path, list[int]]:
    """Two groups of ``trainer_scripts/group_only.py`` (a loop that averages within its group
    only) until every rank exits, at most 90 s; (the run, the ranks' exit codes)."""
    run = make_run(
        tmp_path,
        name,
        # Both groups in every quorum: on a loaded machine the second group's start can lag
        # the first's by more than its 50 steps, and a group alone has no peer to differ from.
        "fault_tolerance.min_replica_groups=2",
        entrypoint=None,
        script=str(SCRIPTS / "group_only.py"),
    )
    server = lighthouse(min_replicas=2)
    try:
        procs = [p for g in (0, 1) for p in start_group(run, server.address(), g, 0, 2).procs]
        return run, wait_all(procs, 90)
    finally:
        server.shutdown()


@pytest.mark.timeout(120)
def test_groups_that_average_within_themselves_only_are_stopped(tmp_path: Path) -> None:
    run, codes = run_group_only(tmp_path, "diverge")
    assert all(code != 0 for code in codes), codes
    for rank in range(2 * GROUP_SIZE):
        record = read_failure(run, rank)
        assert record is not None and record.rank == rank
        assert record.exception == "ReplicaGroupsDiverged"
        # The groups meet at the first check after both are in the quorum (a group that
        # starts later heals from the first at its first step, then drifts off).
        assert re.fullmatch(
            rf"replica groups diverged at step \d*[05]: group {rank // GROUP_SIZE}'s "
            r"parameters differ from the other groups' \(the loop averages gradients within "
            r"its group only\); average them with session.average_gradients\(model\) \(or "
            r"session.wrap_ddp\(model\)\) and step session.optimizer instead of the plain "
            r"optimizer",
            record.message,
        ), record.message


@pytest.mark.timeout(120)
def test_a_slow_heal_completes_though_the_loop_reaches_no_peer_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchft's first quorum has one group take the other's state (step 0). The loop issues
    no cross-group collective of its own, and the healing rank's fetch starts 3 s late: the
    serving group must not withdraw its state at its commit vote before that fetch (it would
    fail after torchft's 30 s lock timeout with HTTP 500, and the groups hang in their next
    quorums). With the fetch done, the groups drift apart and the check stops them."""
    monkeypatch.setenv("SLOW_FETCH_S", "3")
    started = time.monotonic()
    run, codes = run_group_only(tmp_path, "slow-heal")
    took = time.monotonic() - started
    assert all(code != 0 for code in codes), codes
    records = [read_failure(run, rank) for rank in range(2 * GROUP_SIZE)]
    assert [r.exception if r else None for r in records] == ["ReplicaGroupsDiverged"] * 4
    # Start-up, the 3 s wait and up to 10 steps: far below torchft's 30 s lock timeout.
    assert took < 30, took


@pytest.mark.timeout(120)
def test_a_restarted_group_with_no_group_to_heal_from_does_not_start_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group 1's restart, with group 0 gone meanwhile (finished or failed): its first quorum
    holds itself only, so training on would begin at step 0. It stops instead, naming why,
    before a step (and so before a checkpoint of that model) is taken. Both of its ranks do,
    though group rank 1 is 3 s late to configure its process group from the store group
    rank 0 hosts (a loaded machine's gap, made certain): rank 0 waits for it, else rank 1
    retries a store that is gone and the group never ends."""
    slow = Path(__file__).parent / "trainer_scripts" / "slow_configure"
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(slow), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("SLOW_CONFIGURE_S", "3")
    run = make_run(tmp_path, "alone")
    server = lighthouse()
    try:
        group = start_group(run, server.address(), 1, restart=1, groups_n=2)
        codes = wait_all(group.procs, 90)
    finally:
        server.shutdown()
    assert all(code != 0 for code in codes), codes
    for rank in (2, 3):
        record = read_failure(run, rank)
        assert record is not None and record.exception == "NoGroupToHealFrom", record
        assert record.message == (
            "replica group 1 restarted, but no other group trains to heal it from (they "
            "finished or failed meanwhile); it does not start over from step 0"
        )
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    assert groups.read_step(run, 1) is None  # no step committed


@pytest.mark.timeout(150)
def test_the_signal_is_saved_by_one_group_and_every_group_resumes_from_it(
    tmp_path: Path,
) -> None:
    # The precondition: both groups in the quorum when the signal comes. With quorums of one
    # allowed, group 0 would train alone while group 1 still imports torch, and a signal then
    # finds group 1 outside the quorum (it saves on its own after group 0 has left). With
    # quorums of both, step 20 on group 0 is step 20 on both.
    run = make_run(
        tmp_path,
        "signal",
        f"params.step_sleep={STEP_SLEEP}",
        "fault_tolerance.min_replica_groups=2",
    )
    log0 = run / LOGS_DIR / "rank-0.out"
    server = lighthouse(min_replicas=2)
    try:
        first = [start_group(run, server.address(), g, 0, 2, size=1) for g in (0, 1)]
        deadline = time.monotonic() + 60
        while last_step(log0) < 20:
            assert time.monotonic() < deadline, "no training"
            time.sleep(0.02)
        for proc in (p for g in first for p in g.procs):
            os.kill(proc.pid, signal.SIGUSR2)
        codes = wait_all([p for g in first for p in g.procs], 60)
        assert codes == [0, 0]  # Preempted: a clean exit, in both groups
        saved = [p.name for p in (run / "checkpoints").iterdir()]
        assert len(saved) == 1, saved  # one group saved, once
        step = int(saved[0].removeprefix("step-"))
        said = [(run / LOGS_DIR / f"rank-{r}.out").read_text() for r in (0, 1)]
        assert all(f"stopped after saving step {step}" in text for text in said), said
        # The whole job starts again (a requeue): every group loads the step from disk.
        again = [start_group(run, server.address(), g, 0, 2, size=1, start=1) for g in (0, 1)]
        codes = wait_all([p for g in again for p in g.procs], 90)
    finally:
        server.shutdown()
    assert codes == [0, 0]
    for r in (0, 1):
        assert f"starting from step {step}" in (run / LOGS_DIR / f"rank-{r}.out").read_text()
    results = [result_of(run, g, 0) for g in again]
    assert results[0]["start_step"] == results[1]["start_step"] == step
    assert results[0]["param_sha256"] == results[1]["param_sha256"]


def test_replica_groups_without_the_group_environment_train_in_job_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = load_config(
        "examples/mlp", ["fault_tolerance.mode=replica_groups", "parallel.dp_replicate=2"]
    )
    assert group_identity(cfg, {"RANK": "0"}) is None
    assert capsys.readouterr().out == (
        "[ddlaunch] fault_tolerance.mode is replica_groups but this run was not started as "
        "replica groups (no REPLICA_GROUP_ID): training in job mode\n"
    )
    env = GroupIdentity(1, 2, "http://h:1", 4, 3).env(manager_port=0)
    assert group_identity(cfg, env) == GroupIdentity(1, 2, "http://h:1", 4, 3)
    assert group_identity(load_config("examples/mlp"), env) is None  # job mode: env unused


def test_replica_groups_without_torchft_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "torchft" or m.startswith("torchft.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchft", None)  # what a missing package looks like
    with pytest.raises(RuntimeError) as caught:
        replica._torchft()
    assert str(caught.value) == (
        "fault_tolerance.mode: replica_groups needs torchft, which is not installed here: "
        "pip install 'ddlaunch[ft]'"
    )
