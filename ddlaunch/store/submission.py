"""What ``submit`` records around sbatch: ``intent.json`` (written BEFORE sbatch, so that a
crash or a dropped SSH session after it never loses the run), ``submission.json`` (the job
ids, after sbatch returned), ``git.json`` / ``git.diff`` (the submitting work tree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import NUMBER, STRINGS, TEXT

INTENT_FILE = "intent.json"
SUBMISSION_FILE = "submission.json"
GIT_FILE = "git.json"
GIT_DIFF_FILE = "git.diff"
# What readers of the two records rely on (``store.records.clean``).
SUBMISSION_FIELDS = {"job_ids": STRINGS, "submitted": NUMBER}
INTENT_FIELDS = {"state": TEXT, "error": TEXT, "created": NUMBER}


def read_submission(run_dir: Path) -> dict[str, Any]:
    """The submission record; {} when there is none or it cannot be used (``app.runs``
    says which and why); its fields are of their kinds."""
    found, _ = records.load_json(run_dir / SUBMISSION_FILE, dict, {})
    records.clean(found, SUBMISSION_FIELDS, SUBMISSION_FILE)
    return dict(found)


def job_ids(run_dir: Path) -> list[str]:
    return list(read_submission(run_dir).get("job_ids", []))


def write_submission(run_dir: Path, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(run_dir / SUBMISSION_FILE, record, 0o600)


def write_intent(run_dir: Path, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(run_dir / INTENT_FILE, record, 0o600)
