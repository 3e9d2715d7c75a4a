"""The job Slurm queued although ``submit`` recorded its sbatch as failed (no answer) is taken
by the run when it starts (``ddlaunch.job.adoption``, from the start hook): the records
``submit`` leaves in that case, then what the start hook makes of them. The real case, on the
dev cluster with its controller stopped, is ``test_outage_slurm.py``."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ddlaunch.job.adoption import adopt
from ddlaunch.store import submission
from ddlaunch.store.rundir import SUBMITIT_DIR

ERROR = (
    "sbatch (no answer within 7 s) failed (exit 124): ; Slurm may queue the job all the same "
    "once its controller answers: look for one running /runs/r/job.sbatch in `squeue --me -o "
    "'%i %o'` before submitting again"
)


def refused_run(tmp_path: Path, **intent: object) -> Path:
    """A run directory as submit leaves it when sbatch had no answer: a failed intent."""
    run = tmp_path / "r"
    run.mkdir()
    record = submission.Intent(run_id="r", created=1000.0, state="failed", error=ERROR)
    submission.write_intent(run, record.updated(**intent))
    return run


def test_the_job_of_a_failed_submit_is_adopted_with_its_rank_pickle(tmp_path: Path) -> None:
    run = refused_run(tmp_path)
    said = adopt(run, "887", {"SLURM_JOB_ID": "887"})
    assert said == (
        "[ddlaunch] job 887 is this run's: its submit was recorded as failed (sbatch had no "
        "answer), and Slurm queued it all the same"
    )
    intent = submission.read_intent(run)
    assert intent is not None
    assert (intent.state, intent.job_id) == ("submitted", "887")
    assert intent.error == ERROR  # kept: how the submit went is history
    assert intent.note == f"job 887 adopted at its start: its sbatch had failed ({ERROR})"
    assert submission.read_submission(run) == submission.Submission(
        job_ids=("887",), submitted=1000.0
    )
    # The pickle the ranks wait for, for this job id: the rank function on this run.
    with open(run / SUBMITIT_DIR / "887_submitted.pkl", "rb") as handle:
        delayed = pickle.load(handle)
    assert delayed.args == (str(run),)
    assert adopt(run, "887", {"SLURM_JOB_ID": "887"}) is None  # once: now it is the run's


@pytest.mark.parametrize(
    ("intent", "env", "ids"),
    [
        ({"state": "submitted", "job_id": "886"}, {}, ("886",)),  # submit got its id
        ({"job_id": "886"}, {}, ()),  # sbatch answered; the pickle failed and took it back
        ({}, {"SLURM_ARRAY_JOB_ID": "880"}, ()),  # a sweep member's array task
        ({}, {}, ("887",)),  # already the run's (resumed)
        ({"target": "kubernetes"}, {}, ()),
    ],
    ids=["submitted", "withdrawn", "array-task", "listed", "kubernetes"],
)
def test_nothing_else_is_adopted(
    tmp_path: Path, intent: dict[str, object], env: dict[str, str], ids: tuple[str, ...]
) -> None:
    run = refused_run(tmp_path, **intent)
    if ids:
        submission.write_submission(run, submission.Submission(job_ids=ids, submitted=1.0))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert adopt(run, "887", {"SLURM_JOB_ID": "887", **env}) is None
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (run / SUBMITIT_DIR).exists()


def test_a_run_without_an_intent_adopts_nothing(tmp_path: Path) -> None:
    assert adopt(tmp_path, "887", {}) is None
    assert list(tmp_path.iterdir()) == []
