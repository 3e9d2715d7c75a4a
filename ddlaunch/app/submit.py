"""Submit a prepared run: run directory first, intent before sbatch, job id after.

If anything fails after the run directory exists, the directory stays with the config,
the script and the intent record (state ``failed`` and the reason): nothing is lost, and
``ddlaunch resume`` can submit it again.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.gitinfo import git_state
from ddlaunch.app.prepare import Prepared
from ddlaunch.config.trainers import is_byo
from ddlaunch.config.validate import to_plain
from ddlaunch.policy import stop_window
from ddlaunch.runner import Runner, SubprocessRunner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import submission
from ddlaunch.store.rundir import SUBMITIT_DIR, RunDir
from ddlaunch.store.snapshots import write_snapshot


@dataclass(frozen=True)
class Submitted:
    run_id: str
    run_dir: Path
    job_id: str | None


def create_run_dir(prepared: Prepared, runner: Runner, workdir: str) -> RunDir:
    plan = prepared.plan
    run_dir = RunDir.create(Path(plan.run_dir).parent, plan.run_id)
    run_dir.write_config(to_plain(prepared.config))
    run_dir.write_script(prepared.script)
    if prepared.snapshot is not None:
        write_snapshot(run_dir.path, prepared.snapshot.record())
    git = git_state(runner, workdir)
    if git is not None:
        run_dir.write_json(
            submission.GIT_FILE,
            {"commit": git.commit, "branch": git.branch, "dirty": git.dirty, "workdir": workdir},
        )
        if git.diff:
            run_dir.write_text(submission.GIT_DIFF_FILE, git.diff)
    return run_dir


def write_rank_pickle(run_dir: Path, job_id: str) -> None:
    """submitit's pickle of the rank function for ``job_id``, written right after sbatch: the
    job's tasks wait for it (``ddlaunch.worker.task``), and importing submitit (a quarter of a
    second) is no longer on the way from ``submit`` to the job's start."""
    from ddlaunch.launch import slurm  # imports submitit

    slurm.write_rank_pickle(run_dir / SUBMITIT_DIR, run_dir, job_id)


def stop_window_warnings(prepared: Prepared, runner: Runner | None = None) -> list[str]:
    """For a trainer ddlaunch asks to stop: read KillWait, GraceTime and PreemptMode once
    (the probe at the edge) and say what leaves less than one step plus a save
    (``trainer.save_seconds``). Nothing is probed without that estimate."""
    cfg = prepared.config
    if not is_byo(cfg.trainer_kind) or not cfg.trainer.save_seconds:
        return []
    client = SlurmClient(runner or SubprocessRunner())
    try:
        config, partition = client.show_config(), client.show_partition(cfg.job.partition)
    except Exception:  # Slurm unreachable: sbatch will say so
        return []
    window = stop_window.Window(
        kill_wait=stop_window.seconds(config.get("KillWait")),
        grace_time=stop_window.seconds(partition.get("GraceTime")),
        preempt_mode=partition.get("PreemptMode") or config.get("PreemptMode", "OFF"),
    )
    return stop_window.warnings(cfg.fault_tolerance.signal_lead, cfg.trainer.save_seconds, window)


def submit_to_slurm(
    prepared: Prepared,
    *,
    workdir: str,
    runner: Runner | None = None,
    run_dir: RunDir | None = None,
) -> Submitted:
    """Submit ``prepared``; into a new run directory, or (resume) into ``run_dir``."""
    runner = runner or SubprocessRunner()
    client = SlurmClient(runner)
    plan = prepared.plan
    if run_dir is None:
        run_dir = create_run_dir(prepared, runner, workdir)
    previous = submission.read_submission(run_dir.path)
    intent = {
        "run_id": plan.run_id,
        "created": time.time(),
        "submit_host": socket.gethostname(),
        "sbatch_argv": list(plan.sbatch_argv),
        "sources": list(prepared.sources),
        "state": "submitting",
        "previous_job_ids": previous.get("job_ids", []),
    }

    # Written before sbatch runs: a crash or a dropped SSH session between here and the job
    # id leaves a record that a submission was attempted.
    submission.write_intent(run_dir.path, intent)
    try:
        job_id = client.sbatch(plan.sbatch_argv)
    except BaseException as exc:
        submission.write_intent(run_dir.path, {**intent, "state": "failed", "error": str(exc)})
        raise
    try:
        write_rank_pickle(run_dir.path, job_id)
    except BaseException as exc:
        # Without its pickle the job cannot run: take it back rather than let it fail later.
        with contextlib.suppress(Exception):
            client.cancel([job_id])
        failed = {**intent, "state": "failed", "job_id": job_id, "error": str(exc)}
        submission.write_intent(run_dir.path, failed)
        raise
    submission.write_intent(run_dir.path, {**intent, "state": "submitted", "job_id": job_id})
    submission.write_submission(
        run_dir.path,
        {"job_ids": [*previous.get("job_ids", []), job_id], "submitted": time.time()},
    )
    return Submitted(plan.run_id, run_dir.path, job_id)
