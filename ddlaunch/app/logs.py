"""Which log files ``ddlaunch logs`` shows, and, when there are none, why (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch.app.runs import RunInfo, find_member, find_run, read_run
from ddlaunch.app.status import QUIET_FAILURES, attempt_failure, failures_of, run_failure
from ddlaunch.config.validate import load_config
from ddlaunch.errors import UserError
from ddlaunch.store.failures import Failure
from ddlaunch.store.members import member_of
from ddlaunch.store.rundir import LOGS_DIR, batch_logs, config_path, rank_log
from ddlaunch.store.sweeps import member_jobs


@dataclass
class Logs:
    run_dir: Path
    paths: list[Path] = field(default_factory=list)
    failure: Failure | None = None  # the failing rank's record (its traceback)
    missing: str | None = None  # why there is nothing to show yet
    headline: str | None = None  # how the latest attempt failed, shown first
    history: list[str] = field(default_factory=list)  # how each earlier attempt failed
    problems: list[str] = field(default_factory=list)  # the run's records that are unusable


def requeued(info: RunInfo) -> bool:
    """The latest attempt ended and the run did not (no outcome): the job was requeued and
    waits for its next attempt, which makes the latest one history too."""
    return bool(info.attempts) and not info.attempts[-1].is_open and info.outcome is None


def attempt_failures(info: RunInfo) -> list[str]:
    """Each earlier attempt that failed, in words (the latest one is the headline)."""
    out = []
    for rec in info.attempts if requeued(info) else info.attempts[:-1]:
        why = attempt_failure(rec, info.failures)
        if why:
            job = f"job {rec.job_id}, " if rec.job_id else ""
            out.append(f"attempt {rec.attempt} ({job}{rec.cause}): {why}")
    return out


def failing_rank(info: RunInfo) -> tuple[str, int, Failure | None] | None:
    """The latest attempt's failure: its words, the rank whose log to show, and that rank's
    failure record if it raised. None when the run completed or was cancelled (an earlier
    attempt's failure is history), waits for its requeue, or nothing failed."""
    if (info.outcome is not None and info.outcome.state in QUIET_FAILURES) or requeued(info):
        return None
    headline = run_failure(info)
    if headline is None:
        return None
    latest = info.attempts[-1] if info.attempts else None
    mine = failures_of(latest, info.failures) if latest is not None else info.failures
    causes = (latest.causes if latest is not None else None) or ()
    ranked = [c for c in causes if isinstance(c.get("rank"), int)]
    rank = ranked[0]["rank"] if ranked else mine[0].rank if mine else None
    if rank is None:
        return None
    record = next((f for f in mine if f.rank == rank), None)
    return headline, rank, record


def world_size(run_dir: Path) -> int | None:
    """Ranks of the run, from its resolved config (``Config.world_size``)."""
    try:
        return load_config(config_path(run_dir)).world_size
    except (OSError, UserError):  # unknown: any rank may be asked
        return None


def not_started(info: RunInfo) -> str:
    """Why a run without an attempt has no logs."""
    if info.intent is not None and info.intent.failed:
        return f"no logs: the submission failed: {info.intent.error or ''}"
    if info.cancel_requested or (info.outcome is not None and info.outcome.state == "CANCELLED"):
        return "no logs: the run was cancelled before it started"
    if info.job_id:
        return f"no log yet: job {info.job_id} has not started (no attempt recorded)"
    return "no log yet: the run has not started"


def _member_not_started(path: Path) -> str:
    found = member_of(path)
    assert found is not None
    sweep_dir, index = found
    jobs = member_jobs(sweep_dir).get(index)
    what = f"member {index} of sweep {sweep_dir.name}"
    if jobs is not None and jobs.state == "failed":
        return f"no logs: {what} was never submitted: {jobs.error}"
    job = f" (job {jobs.job_ids[-1]})" if jobs and jobs.job_ids else ""
    return f"no log yet: {what} has not started{job}"


def find_logs(ref: str, *, rank: int | None = None, batch: bool = False) -> Logs:
    """The files to show for ``ref`` (``--rank``, ``--batch`` or the default: the failing
    rank's error log, else rank 0's), and why there are none when nothing was written."""
    member = find_member(ref)
    if member is not None:  # a sweep member that has not started has no directory yet
        return Logs(member, missing=_member_not_started(member))
    run_dir = find_run(ref)
    info = read_run(run_dir, with_checkpoints=False)
    logs = Logs(run_dir, problems=info.problems)
    if rank is not None:
        size = world_size(run_dir)
        if rank < 0 or (size is not None and rank >= size):
            ranks = f"ranks 0-{size - 1}" if size and size > 1 else "rank 0"
            raise UserError(f"run {info.run_id} has no rank {rank}: world size {size} ({ranks})")
        logs.paths = [rank_log(run_dir, rank, "out"), rank_log(run_dir, rank, "err")]
    elif batch:
        logs.paths = batch_logs(run_dir)[-1:]
    else:
        logs.history = attempt_failures(info)
        failed = failing_rank(info)
        if failed is not None:
            logs.headline, shown, logs.failure = failed
            logs.paths = [rank_log(run_dir, shown, "err")]
        else:
            logs.paths = [rank_log(run_dir, 0, "out"), rank_log(run_dir, 0, "err")]
    if not any(p.exists() for p in logs.paths):
        if not info.attempts:
            logs.missing = not_started(info)
        else:
            which = "the batch script" if batch else f"rank {0 if rank is None else rank}"
            logs.missing = f"no log yet from {which} in {run_dir / LOGS_DIR}"
    return logs
