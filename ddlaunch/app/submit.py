"""Submit a prepared run: run directory first, intent before sbatch, job id after.

A new run directory appears complete (config, script, git state, the intent with state
``submitting``) or not at all (``RunDir.create_complete``). From sbatch to the record of its
job id, SIGINT and SIGTERM wait (``interrupts.deferred``); then they withdraw the
submission: the job is cancelled and the record says so (``cancel.json``, ``outcome.json``),
or, when the cancel fails, it stays recorded (``ddlaunch cancel`` finds it). An interrupt
before sbatch leaves nothing of a new run, and the intent ``failed`` in a resumed one. If
sbatch itself fails, the directory stays with the intent ``failed`` and the reason:
``ddlaunch resume`` can submit it again.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app import interrupts
from ddlaunch.app.gitinfo import git_state
from ddlaunch.app.prepare import Prepared
from ddlaunch.config.trainers import is_byo
from ddlaunch.config.validate import to_plain
from ddlaunch.errors import UserError
from ddlaunch.policy import stop_window
from ddlaunch.runner import Runner, SubprocessRunner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import outcome, submission
from ddlaunch.store.chain import write_after
from ddlaunch.store.rundir import SUBMITIT_DIR, RunDir, RunIdTaken
from ddlaunch.store.snapshots import write_snapshot

# Fresh ids tried when one is taken meanwhile (32 random bits: practically never twice).
ID_TRIES = 5


@dataclass(frozen=True)
class Submitted:
    run_id: str
    run_dir: Path
    job_id: str | None


def create_run_dir(
    prepared: Prepared, runner: Runner, workdir: str, intent: submission.Intent | None = None
) -> RunDir:
    """The run directory with its config, script, git state (and ``intent``), complete or
    absent."""
    plan = prepared.plan
    git = git_state(runner, workdir)

    def fill(run_dir: RunDir) -> None:
        run_dir.write_config(to_plain(prepared.config))
        run_dir.write_script(prepared.script)
        if prepared.snapshot is not None:
            write_snapshot(run_dir.path, prepared.snapshot.record())
        if git is not None:
            state = {"commit": git.commit, "branch": git.branch, "dirty": git.dirty}
            run_dir.write_json(submission.GIT_FILE, {**state, "workdir": workdir})
            if git.diff:
                run_dir.write_text(submission.GIT_DIFF_FILE, git.diff)
        if prepared.after:  # what it waits for, before sbatch names the jobs
            write_after(run_dir.path, prepared.after)
        if intent is not None:
            submission.write_intent(run_dir.path, intent)

    return RunDir.create_complete(Path(plan.run_dir).parent, plan.run_id, fill)


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


def intent_record(prepared: Prepared, previous_job_ids: list[str]) -> submission.Intent:
    plan = prepared.plan
    return submission.Intent(
        run_id=plan.run_id,
        created=time.time(),
        submit_host=socket.gethostname(),
        sbatch_argv=tuple(plan.sbatch_argv),
        sources=tuple(prepared.sources),
        state="submitting",
        previous_job_ids=tuple(previous_job_ids),
    )


def new_run(
    prepared: Prepared,
    runner: Runner,
    workdir: str,
    reprepare: Callable[[], Prepared] | None = None,
) -> tuple[Prepared, RunDir, submission.Intent]:
    """A new run directory holding the intent; with ``reprepare`` (the run id was made up,
    not given), a fresh id when the one chosen was taken meanwhile."""
    for _ in range(ID_TRIES if reprepare else 1):
        intent = intent_record(prepared, [])
        try:
            return prepared, create_run_dir(prepared, runner, workdir, intent), intent
        except RunIdTaken:
            if reprepare is None:
                raise
            prepared = reprepare()
    raise UserError(f"no free run id after {ID_TRIES} tries under {prepared.plan.run_dir}")


def submit_to_slurm(
    prepared: Prepared,
    *,
    workdir: str,
    runner: Runner | None = None,
    run_dir: RunDir | None = None,
    reprepare: Callable[[], Prepared] | None = None,
) -> Submitted:
    """Submit ``prepared``; into a new run directory, or (resume) into ``run_dir``."""
    runner = runner or SubprocessRunner()
    client = SlurmClient(runner)
    fresh = run_dir is None
    previous = [] if run_dir is None else submission.job_ids(run_dir.path)
    intent = intent_record(prepared, previous)
    job_id: str | None = None
    try:
        if run_dir is None:
            prepared, run_dir, intent = new_run(prepared, runner, workdir, reprepare)
        else:
            # Written before sbatch runs: a crash or a dropped SSH session between here
            # and the job id leaves a record that a submission was attempted.
            submission.write_intent(run_dir.path, intent)
        with interrupts.deferred():
            job_id = _sbatch_and_record(client, run_dir.path, prepared, intent, previous)
        _pickle_or_withdraw(client, run_dir.path, job_id, intent)
    except KeyboardInterrupt as exc:
        if run_dir is not None:
            with interrupts.deferred():  # the clean-up itself is not cut short
                _interrupted(client, run_dir, job_id, intent, exc, fresh)
        else:
            exc.add_note("nothing was submitted; no run directory was left")
        raise
    return Submitted(prepared.plan.run_id, run_dir.path, job_id)


def _sbatch_and_record(
    client: SlurmClient,
    run_dir: Path,
    prepared: Prepared,
    intent: submission.Intent,
    previous: list[str],
) -> str:
    try:
        job_id = client.sbatch(prepared.plan.sbatch_argv)
    except BaseException as exc:
        submission.write_intent(run_dir, intent.updated(state="failed", error=str(exc)))
        raise
    # The job id first: from here on `cancel` and `status` find the job.
    ids = (*previous, job_id)
    submission.write_submission(run_dir, submission.Submission(job_ids=ids, submitted=time.time()))
    submission.write_intent(run_dir, intent.updated(state="submitted", job_id=job_id))
    return job_id


def _pickle_or_withdraw(
    client: SlurmClient, run_dir: Path, job_id: str, intent: submission.Intent
) -> None:
    try:
        write_rank_pickle(run_dir, job_id)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # Without its pickle the job cannot run: take it back rather than let it fail later.
        with contextlib.suppress(Exception):
            client.cancel([job_id])
        failed = intent.updated(state="failed", job_id=job_id, error=str(exc))
        submission.write_intent(run_dir, failed)
        raise


def _interrupted(
    client: SlurmClient,
    run_dir: RunDir,
    job_id: str | None,
    intent: submission.Intent,
    exc: KeyboardInterrupt,
    fresh: bool,
) -> None:
    """Leave records that say what the interrupt did (see the module docstring)."""
    path, why = run_dir.path, f"interrupted by {interrupts.signal_name(exc)}"
    if job_id is None:
        if fresh:
            import shutil  # lazy: only an interrupted submit removes a directory

            shutil.rmtree(path, ignore_errors=True)
            exc.add_note("nothing was submitted; no run directory was left")
        else:
            record = intent.updated(state="failed", error=f"{why} before sbatch ran")
            submission.write_intent(path, record)
            exc.add_note(f"nothing was submitted; {path.name} is recorded as not submitted")
        return
    outcome.write_cancel(path, [job_id])
    try:
        client.cancel([job_id])
    except UserError as error:
        (path / outcome.CANCEL_FILE).unlink(missing_ok=True)
        # It stays queued and recorded: give it its pickle so that it can run.
        with contextlib.suppress(Exception):
            write_rank_pickle(path, job_id)
        exc.add_note(
            f"job {job_id} was submitted and could not be cancelled ({error}); it is "
            f"recorded in {path}: ddlaunch cancel {path.name}"
        )
        return
    reason = f"{why} right after sbatch; job {job_id} cancelled"
    outcome.write_outcome(path, "CANCELLED", reason)
    submission.write_intent(path, intent.updated(state="submitted", job_id=job_id, note=reason))
    exc.add_note(f"job {job_id} was cancelled; {path.name} records it")
