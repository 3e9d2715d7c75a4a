"""Sweeps on the real dev cluster (3 nodes x 4 fake GPUs, MaxArraySize 101).

One 12-member sweep of the example MLP (1 CPU rank each, 20 steps) serves most tests, so that
torch is imported once per member: split into arrays of at most 5 tasks, one member killed
mid-run (requeued alone, resumed from its own checkpoint), two members failing on purpose
and then resubmitted. A held 150-member sweep checks the split at the real MaxArraySize
without running anything.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch as ddlaunch
from support.devcluster import wait_for

from ddlaunch.checkpoint.layout import latest_complete
from ddlaunch.store.sweeps import array_task_ids, member_run_dirs
from ddlaunch.sweeps.status import collect, summary

# One worker runs the module: its tests share one 12-member sweep (the module's fixture).
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("sweep_run")]
TESTS = Path(__file__).resolve().parent
LRS = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
FAILING = {8, 9}  # lr 0.05 (zip: fail_once true), seeds 0 and 1
VICTIM = 0


def sweep_status(sweep_dir: Path, cwd: Path) -> dict:
    proc = ddlaunch("sweep", "status", str(sweep_dir), "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def array_ids(sweep_dir: Path) -> list[str]:
    records = [json.loads(p.read_text()) for p in (sweep_dir / "arrays").glob("*.json")]
    records.sort(key=lambda r: int(r["name"]))
    return [r["job_id"] for r in records if r.get("job_id")]


def wait_states(sweep_dir: Path, cwd: Path, wanted: dict[int, str], timeout: float) -> dict:
    """Poll (in process: a CLI per poll would steal CPU from the members) until member i is
    in state wanted[i] for all i (others: any); then `sweep status --json` once."""
    last: list = []

    def settled() -> bool:
        last[:] = collect(sweep_dir)
        return all(last[i].state == s for i, s in wanted.items())

    try:
        wait_for(settled, timeout, "member states", poll=1.0)
    except TimeoutError:
        raise TimeoutError(f"members not in {wanted}: {summary(last)}\n{last}") from None
    return sweep_status(sweep_dir, cwd)


@dataclass
class SweepRun:
    cwd: Path
    sweep_dir: Path
    submit_out: str
    victim_job: str = ""
    victim_raw_id: str = ""
    first_round: dict = field(default_factory=dict)
    resubmit_out: str = ""
    final: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def sweep_run(slurm_cluster, tmp_path_factory: pytest.TempPathFactory):
    cwd = tmp_path_factory.mktemp("sweep")
    base = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": "t-sweep", "time": "00:05:00"},
        # One CPU rank per member: GPUs (12 in all, shared with other tests) would make
        # members queue behind each other; the example trains on the CPU anyway.
        "nodes": {"count": 1, "gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "sweep_entrypoints:mlp_fail_once",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
        # max_restarts 0: the killed member must go through the requeue of its array task
        # (a restart inside the allocation would not exercise it).
        "fault_tolerance": {
            "checkpoint_every_steps": 5,
            "keep_last": 0,
            "max_requeues": 2,
            "max_restarts": 0,
        },
        # Node health has its own tests; its preflight imports torch once more per member.
        "health": {"preflight": False, "watchdog": False},
        "params": {"steps": 20, "batch_size": 32, "step_sleep": 0.3},
    }
    (cwd / "base.yaml").write_text(yaml.safe_dump(base))
    (cwd / "sweep.yaml").write_text(
        yaml.safe_dump(
            {
                "base": "base.yaml",
                "zip": {"params.lr": LRS, "params.fail_once": [lr == 0.05 for lr in LRS]},
                "seeds": 2,
            },
            sort_keys=False,
        )
    )
    proc = ddlaunch("sweep", "sweep.yaml", "--max-array-size", "5", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    sweep_dir = Path(proc.stdout.splitlines()[1].split(": ", 1)[1])
    run = SweepRun(cwd, sweep_dir, proc.stdout)
    try:
        victim = sweep_dir / "members" / str(VICTIM)
        # Its run directory appears when it starts; the array's record has its id now.
        run.victim_job = array_task_ids(sweep_dir)[VICTIM]
        # Kill the victim's step once it committed a checkpoint: the end hook then sees a
        # crash that made progress and requeues this array task only.
        wait_for(
            lambda: (info := latest_complete(victim / "checkpoints")) and info.step >= 5,
            240,
            "the victim's first checkpoint",
            poll=0.2,
        )
        run.victim_raw_id = slurm_cluster.job_field(run.victim_job, "JobId")
        # A crash of its rank (kill -9), not `scancel --signal=KILL`: Slurm records that as
        # a cancel, and a cancelled job is not requeued.
        pids = slurm_cluster.rank_pids(victim)
        assert pids, "the victim's rank process was not found"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # Resubmit the failing members as soon as they failed, while the others still run.
        run.first_round = wait_states(sweep_dir, cwd, dict.fromkeys(FAILING, "FAILED"), 300)
        proc = ddlaunch("sweep", "resubmit", sweep_dir.name, "--failed", cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        run.resubmit_out = proc.stdout
        run.final = wait_states(sweep_dir, cwd, dict.fromkeys(range(12), "COMPLETED"), 240)
        yield run
    finally:
        slurm_cluster.cancel(array_ids(sweep_dir))


def test_sweep_members_complete_with_their_own_overrides(sweep_run: SweepRun) -> None:
    members = member_run_dirs(sweep_run.sweep_dir)
    assert len(members) == 12
    losses = {}
    for index, (label, run_dir) in enumerate(members):
        lr, seed = LRS[index // 2], index % 2
        assert (
            label == f"params.lr={lr} params.fail_once={str(lr == 0.05).lower()} params.seed={seed}"
        )
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (config["params"]["lr"], config["params"]["seed"]) == (lr, seed)
        result = json.loads((run_dir / "result.json").read_text())
        assert result["steps"] == 20 and result["world_size"] == 1
        losses[(lr, seed)] = result["final_loss"]
        # rank and batch logs are the member's own
        assert "[ddlaunch] rank 0/1" in (run_dir / "logs" / "rank-0.out").read_text()
        assert list((run_dir / "logs").glob("batch-*_*.out"))
    assert len(set(losses.values())) == 12  # every member trained its own setting
    rows = sweep_run.final["members"]
    assert [r["metric"] for r in rows] == [losses[(LRS[i // 2], i % 2)] for i in range(12)]
    assert sweep_run.final["summary"] == "12 members: 12 COMPLETED"


def test_sweep_is_split_at_max_array_size(sweep_run: SweepRun) -> None:
    assert "12 members in 3 arrays (MaxArraySize 5)" in sweep_run.submit_out
    records = sorted(
        (json.loads(p.read_text()) for p in (sweep_run.sweep_dir / "arrays").glob("*.json")),
        key=lambda r: int(r["name"]),
    )
    assert [r["members"] for r in records[:3]] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert all(r["state"] == "submitted" for r in records)
    assert [a for a in records[0]["sbatch_argv"] if a.startswith("--array")] == ["--array=0-4"]


def test_killed_member_is_requeued_alone_from_its_own_checkpoint(sweep_run: SweepRun) -> None:
    array_id = sweep_run.victim_job.split("_")[0]
    # The victim's task is not the one that holds the array's own id (see the requeue test
    # below for why that matters to the end hook).
    assert sweep_run.victim_raw_id != array_id
    members = dict(enumerate(run for _, run in member_run_dirs(sweep_run.sweep_dir)))
    victim = json.loads((members[VICTIM] / "attempts.json").read_text())
    assert len(victim) == 2, victim
    # The killed rank's step fails; the end hook sees a crash that made progress and
    # requeues with the task's own SLURM_JOB_ID, so only this task.
    assert victim[0]["cause"] == "crash", victim
    assert victim[0]["job_id"] == victim[1]["job_id"] == sweep_run.victim_raw_id
    resumed = victim[1]["resumed_from"]
    assert resumed is not None and resumed >= 5
    result = json.loads((members[VICTIM] / "result.json").read_text())
    assert result["start_step"] == resumed
    # Its checkpoints are its own; every other member ran exactly once (the failing ones
    # once more when resubmitted), untouched by the requeue.
    assert latest_complete(members[VICTIM] / "checkpoints").step == 20
    for index, run_dir in members.items():
        if index in (VICTIM, *FAILING):
            continue
        runs = json.loads((run_dir / "attempts.json").read_text())
        assert len(runs) == 1 and runs[0]["cause"] == "completed", (index, runs)
        assert json.loads((run_dir / "result.json").read_text())["start_step"] == 0


def test_resubmit_failed_submits_exactly_the_failed_members(sweep_run: SweepRun) -> None:
    first = {m["index"]: m for m in sweep_run.first_round["members"]}
    assert {i for i, m in first.items() if m["state"] in ("FAILED", "STOPPED")} == FAILING
    assert "RuntimeError: deterministic failure" in first[8]["note"]
    assert sweep_run.resubmit_out.splitlines()[0].endswith(": 8, 9")
    assert "(2 tasks, members 8-9)" in sweep_run.resubmit_out
    for index, (_, run_dir) in enumerate(member_run_dirs(sweep_run.sweep_dir)):
        job_ids = json.loads((run_dir / "submission.json").read_text())["job_ids"]
        assert len(job_ids) == (2 if index in FAILING else 1), (index, job_ids)
    final = {m["index"]: m for m in sweep_run.final["members"]}
    assert all(
        final[i]["state"] == "COMPLETED" and final[i]["note"] in ("", "completed") for i in FAILING
    )


def test_member_is_a_normal_run_dir_for_status_and_logs(sweep_run: SweepRun) -> None:
    run_dir = sweep_run.sweep_dir / "members" / "3"
    status = ddlaunch("status", str(run_dir), "--json", cwd=sweep_run.cwd)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["state"] == "COMPLETED"
    logs = ddlaunch("logs", str(run_dir), "--batch", cwd=sweep_run.cwd)
    assert "[ddlaunch] COMPLETED" in logs.stdout, logs.stdout + logs.stderr


def test_held_sweep_above_max_array_size_is_split(slurm_cluster, tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "defaults: [examples/mlp]\njob: {name: t-split}\n"
        "nodes: {count: 1, gpus_per_node: 1, cpus_per_task: 1}\n"
    )
    trials = ", ".join(map(str, range(150)))
    (tmp_path / "sweep.yaml").write_text(f"base: base.yaml\ngrid:\n  params.trial: [{trials}]\n")
    proc = ddlaunch("sweep", "sweep.yaml", "--hold", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep_dir = Path(proc.stdout.splitlines()[1].split(": ", 1)[1])
    try:
        # Submitting wrote no file per member: held, none started to create its directory.
        assert not (sweep_dir / "members").exists()
        assert not (sweep_dir / "submitit").exists()
        assert "150 members in 2 arrays (MaxArraySize 101)" in proc.stdout
        assert "(101 tasks, members 0-100)" in proc.stdout
        assert "(49 tasks, members 101-149)" in proc.stdout
        status = sweep_status(sweep_dir, tmp_path)
        assert status["summary"] == "150 members: 150 PENDING"
        jobs = [m["job_id"] for m in status["members"]]
        ids = array_ids(sweep_dir)
        assert jobs == [f"{ids[0]}_{t}" for t in range(101)] + [f"{ids[1]}_{t}" for t in range(49)]
    finally:
        slurm_cluster.cancel(array_ids(sweep_dir))


REQUEUE_PROBE = """\
#!/bin/bash
echo "$SLURM_JOB_ID $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID ${SLURM_RESTART_COUNT:-0}" \
  >> "$1/task-$SLURM_ARRAY_TASK_ID"
sleep 60
"""


@pytest.mark.matrix
def test_requeue_of_an_array_task_needs_its_array_task_id(slurm_cluster, tmp_path: Path) -> None:
    """Why a requeue from inside an array task must name ``ARRAYJOB_TASK``: the task that
    keeps the array's own id has SLURM_JOB_ID == SLURM_ARRAY_JOB_ID, and ``scontrol requeue
    <that id>`` requeues every task of the array (finished ones included)."""
    script = tmp_path / "probe.sh"
    script.write_text(REQUEUE_PROBE)
    array = slurm_cluster.slurm(
        *("sbatch", "--parsable", "-p", "debug", "-n1", "--array=0-1", "--requeue"),
        *(f"--output={tmp_path}/%A_%a.out", str(script), str(tmp_path)),
    ).stdout.strip()

    def starts() -> dict[str, list[list[str]]]:
        return {
            p.name: [ln.split() for ln in p.read_text().splitlines()]
            for p in tmp_path.glob("task-*")
        }

    try:
        wait_for(lambda: len(starts()) == 2, 120, "both tasks running")
        holder = next(r[0] for r in starts().values() if r[0][0] == array)  # keeps the id
        other = next(r[0] for r in starts().values() if r[0][0] != array)
        assert holder[1] == other[1] == array
        # Right: the array-task form requeues that task only, even the id holder.
        slurm_cluster.slurm("scontrol", "requeue", f"{array}_{holder[2]}")
        wait_for(lambda: len(starts()[f"task-{holder[2]}"]) == 2, 120, "the holder's restart")
        assert len(starts()[f"task-{other[2]}"]) == 1
        # Wrong: the holder's own SLURM_JOB_ID (the array id) requeues the whole array.
        slurm_cluster.slurm("scontrol", "requeue", holder[0])
        wait_for(lambda: len(starts()[f"task-{other[2]}"]) == 2, 120, "the other's restart")
    finally:
        slurm_cluster.cancel([array])
