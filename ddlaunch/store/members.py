"""A sweep member's own run directory, ``<sweep>/members/<i>/``: created the first time
someone needs it (normally the member's array task when it starts), from the sweep's records
only, so whoever creates it (the task, ``sweep resubmit``, ``resume``) creates the same
directory. Creation is idempotent and crash-safe: the directory is built under a temporary
name and renamed into place, so it appears complete or not at all; ``config.yaml`` is the
marker of a complete member directory, written last when the directory already existed (a
``mkdir -p`` of the script when Python was not usable before ``launch.setup``)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.store.outcome import CANCEL_FILE
from ddlaunch.store.rundir import CONFIG_FILE, LOGS_DIR
from ddlaunch.store.submission import (
    INTENT_FILE,
    SUBMISSION_FILE,
    Intent,
    Submission,
    read_submission,
    write_submission,
)
from ddlaunch.store.sweep_cancels import is_cancelled
from ddlaunch.store.sweeps import (
    ARRAYS_DIR,
    MEMBERS_DIR,
    MEMBERS_FILE,
    MemberJobs,
    member_jobs,
    packed_config_text,
    read_packed,
)


def is_materialized(run_dir: Path) -> bool:
    return (run_dir / CONFIG_FILE).is_file()


def member_config_text(sweep_dir: Path, index: int) -> tuple[str, str]:
    """(config text, where it came from): the member's own ``config.yaml`` once its
    directory exists (resubmissions may have changed it), else ``members.json``."""
    own = sweep_dir / MEMBERS_DIR / str(index) / CONFIG_FILE
    try:
        return own.read_text(encoding="utf-8"), str(own)
    except FileNotFoundError:
        text = packed_config_text(read_packed(sweep_dir), index)
        return text, f"{sweep_dir / MEMBERS_FILE} (member {index})"


# ----------------------------------------------------------------------------- creating


def _member_files(
    sweep_dir: Path, index: int, job_id: str | None, array: str | None
) -> dict[str, dict[str, object]]:
    """The records a member directory starts with, derived from the sweep's records plus
    the starting task's own id (its array's record may not have it yet: the task can start
    before the submitter wrote the id down)."""
    jobs = member_jobs(sweep_dir).get(index, MemberJobs())
    ids = list(jobs.job_ids)
    if job_id and job_id not in ids:
        ids.append(job_id)
    array = array or jobs.array
    files: dict[str, dict[str, object]] = {}
    about = {"sweep_id": sweep_dir.name}
    if array is not None:
        about |= {"array": array, "script": str(sweep_dir / ARRAYS_DIR / f"{array}.sbatch")}
    if ids:
        record = Submission.from_json({"job_ids": ids, "submitted": jobs.time, **about})
        files[SUBMISSION_FILE] = record.to_json()
    if is_cancelled(sweep_dir, index, ids[-1] if ids else None):
        # Cancelled while it waited (`ddlaunch cancel`): this start must not train or
        # requeue.
        files[CANCEL_FILE] = {"time": time.time(), "job_ids": ids[-1:]}
    if jobs.state == "failed" and not job_id:
        # Its latest array's sbatch failed: status shows SUBMIT_FAILED, as for a run.
        # from_json: an error not known is recorded as null
        intent = Intent.from_json(
            {
                "run_id": str(index),
                **about,
                "state": "failed",
                "error": jobs.error,
                "previous_job_ids": ids,
            }
        )
        files[INTENT_FILE] = intent.to_json()
    return files


def _write_json(path: Path, obj: dict[str, object]) -> None:
    fsutil.atomic_write_json(path, obj, 0o600)


def materialize(
    sweep_dir: Path, index: int, job_id: str | None = None, array: str | None = None
) -> Path:
    """Create member ``index``'s run directory if it is not complete yet; returns it.

    ``job_id``, ``array``: the starting task's ``ARRAY_TASK`` id and its array's name; the
    id is added to ``submission.json`` (also when the directory exists: a resubmitted
    member starting before the submitter wrote its new id down)."""
    sweep_dir = Path(sweep_dir)
    run = sweep_dir / MEMBERS_DIR / str(index)
    if is_materialized(run):
        if job_id:
            _add_job_id(run, job_id)
        return run
    packed = read_packed(sweep_dir)
    text = packed_config_text(packed, index)  # KeyError: no such member
    files = _member_files(sweep_dir, index, job_id, array)
    if not run.exists():
        run.parent.mkdir(exist_ok=True)  # members/: with the first member's directory
        tmp = run.with_name(f".{index}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
        try:
            tmp.mkdir(mode=0o700)
            (tmp / LOGS_DIR).mkdir()
            for name, obj in files.items():
                _write_json(tmp / name, obj)
            fsutil.atomic_write_text(tmp / CONFIG_FILE, text, 0o600)
            os.rename(tmp, run)  # replaces nothing but an empty directory
            fsutil.fsync_dir(run.parent)
            return run
        except OSError as exc:
            import shutil  # only here: status imports this module

            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # Someone else created it meanwhile: complete it below if need be.
    if is_materialized(run):
        if job_id:
            _add_job_id(run, job_id)
        return run
    # The directory exists without its config: made by the script's `mkdir -p` (Python was
    # not usable before launch.setup) or left by a crash. Complete it, config last.
    (run / LOGS_DIR).mkdir(exist_ok=True)
    for name, obj in files.items():
        if name == SUBMISSION_FILE or not (run / name).exists():
            _write_json(run / name, obj)
    fsutil.atomic_write_text(run / CONFIG_FILE, text, 0o600)
    return run


def _add_job_id(run: Path, job_id: str) -> None:
    record = read_submission(run)  # torn by a crash: empty, the arrays' records have the ids
    ids = record.job_ids or ()
    if job_id not in ids:
        submitted = record.submitted or time.time()
        write_submission(run, record.updated(job_ids=[*ids, job_id], submitted=submitted))


def member_of(run_dir: Path) -> tuple[Path, int] | None:
    """(sweep directory, index) when ``run_dir`` is ``<sweep>/members/<i>`` of a sweep."""
    run_dir = Path(run_dir)
    if not run_dir.name.isdigit() or run_dir.parent.name != MEMBERS_DIR:
        return None
    sweep_dir = run_dir.parent.parent
    if not (sweep_dir / MEMBERS_FILE).is_file():
        return None
    return sweep_dir, int(run_dir.name)


def ensure_member_dir(run_dir: str | os.PathLike[str]) -> bool:
    """Create ``run_dir`` if it is a sweep member's directory that does not exist yet (for
    commands that need a member's run directory: logs, cancel, resume). Returns whether it
    is a complete member directory now; False for anything that is not a sweep member."""
    found = member_of(Path(run_dir).expanduser().absolute())
    if found is None:
        return False
    sweep_dir, index = found
    try:
        materialize(sweep_dir, index)
    except (KeyError, ValueError):  # no such member in members.json, or it is damaged
        return False
    return True
