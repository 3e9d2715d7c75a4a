"""Concurrent commands and interrupts on the real dev cluster (held jobs: nothing runs).

50 concurrent ``submit`` into one run root; two concurrent ``resume`` and ``sweep resubmit``
of one run (an sbatch made slower by a wrapper on PATH widens the window in which both
would submit); SIGINT to ``submit`` and SIGTERM to ``resume`` while sbatch runs (the
terminal's Ctrl-C goes to the whole process group: sbatch in its own session is spared).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.devcluster import wait_for
from support.slurm_runs import env_for, held_config, job_of

pytestmark = pytest.mark.slurm


def start(args: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as at a terminal
    )


def slow_sbatch(tmp_path: Path, before: float = 0.0, after: float = 0.0) -> Path:
    """A directory whose ``sbatch`` runs the real one, waiting ``before`` and ``after``."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    real = shutil.which("sbatch")
    (shim / "sbatch").write_text(
        f'#!/bin/bash\nsleep {before}\nout=$({real} "$@")\nrc=$?\nsleep {after}\n'
        'echo "$out"\nexit $rc\n'
    )
    (shim / "sbatch").chmod(0o755)
    return shim


def test_50_concurrent_submits_get_50_complete_run_dirs(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    # A job name of this run's own: the queue is counted by name, and held jobs of an
    # earlier, interrupted run of this test may still be queued under the old one.
    name = f"t-many-{uuid.uuid4().hex[:8]}"
    config = held_config(tmp_path, name)
    env = env_for(tmp_path)
    procs = [start(["submit", str(config)], tmp_path, env) for _ in range(50)]
    outs = [p.communicate(timeout=300) for p in procs]
    # Cancelled after the test whatever it finds: held jobs would stay queued for good.
    slurm_job_cleanup.extend(
        job_of(out)[1] for p, (out, _) in zip(procs, outs, strict=True) if p.returncode == 0
    )
    failed = [
        (p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0
    ]
    assert not failed, failed[:3]
    runs = [job_of(out) for out, _ in outs]
    assert len({run for run, _ in runs}) == 50 and len({job for _, job in runs}) == 50
    # (.snapshots/ holds the code snapshot the runs share: launch.snapshot)
    listed = [name for name in os.listdir(tmp_path / "runs") if name != ".snapshots"]
    assert sorted(listed) == sorted(run for run, _ in runs)
    for run, job in runs:
        run_dir = tmp_path / "runs" / run
        intent = json.loads((run_dir / "intent.json").read_text())
        assert intent["state"] == "submitted" and intent["job_id"] == job
        assert json.loads((run_dir / "submission.json").read_text())["job_ids"] == [job]
        assert (run_dir / "config.yaml").is_file() and (run_dir / "job.sbatch").is_file()
        assert (run_dir / "submitit" / f"{job}_submitted.pkl").is_file()
    queued = slurm_cluster.slurm("squeue", "-h", "-n", name, "-o", "%i").stdout.split()
    assert sorted(queued) == sorted(job for _, job in runs)


def test_two_concurrent_resumes_submit_once(slurm_cluster, slurm_job_cleanup, tmp_path) -> None:
    config = held_config(tmp_path, "t-twice")
    submitted = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(config)],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    run, job = job_of(submitted.stdout)
    slurm_job_cleanup.append(job)
    slurm_cluster.cancel([job])
    slurm_cluster.wait_job_state(job, "CANCELLED", timeout=30)
    env = env_for(tmp_path, slow_sbatch(tmp_path, before=2))
    pair = [start(["resume", run], tmp_path, env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in pair]
    codes = sorted(p.returncode for p in pair)
    assert codes == [0, 2], outs
    winner, loser = (outs[0], outs[1]) if pair[0].returncode == 0 else (outs[1], outs[0])
    assert f"error: run {run} is already being resumed (resumed by pid " in loser[1], loser
    new_job = job_of(winner[0])[1]
    slurm_job_cleanup.append(new_job)
    record = json.loads((tmp_path / "runs" / run / "submission.json").read_text())
    assert record["job_ids"] == [job, new_job]


def test_two_concurrent_sweep_resubmits_submit_once(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    base = held_config(tmp_path, "t-sweep")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {base}\nname: t-sw\nlist: [{{params.x: 1}}, {{params.x: 2}}]\n")
    env = env_for(tmp_path)
    made = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "sweep", str(sweep)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    array = made.stdout.split("job ")[1].split()[0]
    slurm_job_cleanup.append(array)
    slurm_cluster.cancel([array])
    (sweep_dir,) = (tmp_path / "runs").glob("t-sw-*")
    wait_for(lambda: slurm_cluster.job_state(f"{array}_0") in ("CANCELLED", None), 30, "cancelled")
    env = env_for(tmp_path, slow_sbatch(tmp_path, before=2))
    args = ["sweep", "resubmit", sweep_dir.name, "--member", "0", "--member", "1"]
    pair = [start(args, tmp_path, env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in pair]
    assert sorted(p.returncode for p in pair) == [0, 2], outs
    loser = outs[0] if pair[0].returncode else outs[1]
    assert f"sweep {sweep_dir.name} is already being resubmitted (resubmitted by pid" in loser[1]
    records = sorted((sweep_dir / "arrays").glob("*.json"))
    assert len(records) == 2, records  # the sweep's array and exactly one resubmission
    slurm_job_cleanup.append(json.loads(records[-1].read_text())["job_id"])


@pytest.mark.parametrize(
    ("verb", "sig"),
    [("submit", signal.SIGINT), ("resume", signal.SIGTERM)],
    ids=["submit-SIGINT", "resume-SIGTERM"],
)
def test_interrupt_while_sbatch_runs_cancels_and_records(
    slurm_cluster, slurm_job_cleanup, tmp_path, verb: str, sig: signal.Signals
) -> None:
    config = held_config(tmp_path, f"t-{verb}-int")
    args = ["submit", str(config)]
    if verb == "resume":
        first = subprocess.run(
            [sys.executable, "-m", "ddlaunch", *args],
            cwd=tmp_path,
            env=env_for(tmp_path),
            capture_output=True,
            text=True,
            check=True,
        )
        run, job = job_of(first.stdout)
        slurm_job_cleanup.append(job)
        slurm_cluster.cancel([job])
        slurm_cluster.wait_job_state(job, "CANCELLED", timeout=30)
        args = ["resume", run]
    before = set(_queued(slurm_cluster, f"t-{verb}-int"))
    proc = start(args, tmp_path, env_for(tmp_path, slow_sbatch(tmp_path, after=3)))
    # The job is queued; sbatch (the wrapper) has not returned yet.
    new = wait_for(lambda: set(_queued(slurm_cluster, f"t-{verb}-int")) - before, 60, "job")
    (job_id,) = new
    slurm_job_cleanup.append(job_id)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith(f"t-{verb}")]
    note = f"job {job_id} was cancelled; {run_dir.name} records it"
    assert err.strip().endswith(f"interrupted ({sig.name}): {note}"), err
    assert slurm_cluster.wait_job_state(job_id, "CANCELLED", timeout=30) == "CANCELLED"
    intent = json.loads((run_dir / "intent.json").read_text())
    assert intent["state"] == "submitted" and intent["job_id"] == job_id
    assert json.loads((run_dir / "submission.json").read_text())["job_ids"][-1] == job_id
    outcome = json.loads((run_dir / "outcome.json").read_text())
    reason = f"interrupted by {sig.name} right after sbatch; job {job_id} cancelled"
    assert outcome["state"] == "CANCELLED" and outcome["reason"] == reason
    status = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "status", run_dir.name, "--json"],
        cwd=tmp_path,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
    )
    assert json.loads(status.stdout)[0]["state"] == "CANCELLED", status.stdout


def _queued(cluster, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return cluster.slurm("squeue", "-h", "-n", name, "-o", "%i").stdout.split()
