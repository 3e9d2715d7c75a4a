"""A job Slurm queued although its ``sbatch`` got no answer: the run takes it as its own when
it starts.

``submit`` records such a submission as failed (``intent.json``, no job id): sbatch had sent
the request, but the controller did not answer in time. A controller that answers again may
still queue the job (measured on the dev cluster with slurmctld stopped, then resumed: the job
was queued and ran). Started in the run's directory, that job found no rank pickle (submit
writes it once sbatch returns the job id), so its ranks failed after waiting for it, and
``status`` said SUBMIT_FAILED for a run whose job was running.

The start hook, the first thing the job does on its batch host, now adopts it: the rank
pickle for its job id, the job id in ``submission.json``, and the intent marked submitted
with a note saying how. From then on every verb sees an ordinary run. Only a failed intent
without a job id is adopted: a run whose submit succeeded, or was resubmitted, already names
its job, and an array task is a sweep member's (adopted by ``sweep_task``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from ddlaunch.store import submission
from ddlaunch.store.rundir import SUBMITIT_DIR


def adopt(run_dir: Path, job_id: str, env: Mapping[str, str]) -> str | None:
    """Make ``job_id`` the run's job if its submit was recorded as failed without one; the
    line that says so, or None when there was nothing to adopt."""
    intent = submission.read_intent(run_dir)
    if intent is None or not intent.failed or intent.job_id or intent.target == "kubernetes":
        return None
    if env.get("SLURM_ARRAY_JOB_ID"):
        return None
    ids = submission.job_ids(run_dir)
    if job_id in ids:
        return None
    from ddlaunch.launch.slurm import write_rank_pickle  # imports submitit: adoptions only

    write_rank_pickle(run_dir / SUBMITIT_DIR, run_dir, job_id)
    submitted = intent.created or time.time()
    record = submission.Submission(job_ids=(*ids, job_id), submitted=submitted)
    submission.write_submission(run_dir, record)
    note = f"job {job_id} adopted at its start: its sbatch had failed ({intent.error})"
    submission.write_intent(run_dir, intent.updated(state="submitted", job_id=job_id, note=note))
    return (
        f"[ddlaunch] job {job_id} is this run's: its submit was recorded as failed "
        "(sbatch had no answer), and Slurm queued it all the same"
    )
