"""What ``submit`` records around sbatch: ``intent.json`` (written BEFORE sbatch, so that a
crash or a dropped SSH session after it never loses the run), ``submission.json`` (the job
ids, after sbatch returned), ``git.json`` / ``git.diff`` (the submitting work tree)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import NUMBER, OBJECT, STRINGS, TEXT

INTENT_FILE = "intent.json"
SUBMISSION_FILE = "submission.json"
GIT_FILE = "git.json"
GIT_DIFF_FILE = "git.diff"
# What readers of the two records rely on (``store.records.clean``); ``Submission`` and
# ``Intent`` have one attribute each.
SUBMISSION_FIELDS = {
    "job_ids": STRINGS,
    "submitted": NUMBER,
    "kubernetes": OBJECT,  # --target kubernetes: the object's kind, name, namespace
}
INTENT_FIELDS = {
    "run_id": TEXT,
    "created": NUMBER,
    "submit_host": TEXT,
    # submitting (sbatch not returned yet), submitted, failed; written (Kubernetes: the
    # manifest only, kubectl is not usable here)
    "state": TEXT,
    "error": TEXT,  # why the submission failed
    "job_id": TEXT,
    "previous_job_ids": STRINGS,
    "sbatch_argv": STRINGS,
    "sources": STRINGS,  # the files and overrides the config was made of
    "note": TEXT,
    # --target kubernetes: the target, its object (kind, name, namespace), the kubectl argv
    # and why it was not applied here
    "target": TEXT,
    "kubernetes": OBJECT,
    "apply_argv": STRINGS,
    "why": TEXT,
}


@dataclass(frozen=True, kw_only=True)
class Submission(records.Record):
    """``submission.json``: the run's job ids, oldest first (a resumed run has several)."""

    FIELDS: ClassVar[records.Fields] = SUBMISSION_FIELDS
    NAME: ClassVar[str] = SUBMISSION_FILE

    job_ids: tuple[str, ...] | None = None
    submitted: float | None = None
    kubernetes: Mapping[str, object] | None = None


@dataclass(frozen=True, kw_only=True)
class Intent(records.Record):
    """``intent.json``: what was about to be submitted and how far it got (``state``)."""

    FIELDS: ClassVar[records.Fields] = INTENT_FIELDS
    NAME: ClassVar[str] = INTENT_FILE

    run_id: str | None = None
    created: float | None = None
    submit_host: str | None = None
    state: str | None = None
    error: str | None = None
    job_id: str | None = None
    previous_job_ids: tuple[str, ...] | None = None
    sbatch_argv: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    note: str | None = None
    target: str | None = None
    kubernetes: Mapping[str, object] | None = None
    apply_argv: tuple[str, ...] | None = None
    why: str | None = None

    @property
    def failed(self) -> bool:
        """The submission failed (sbatch or kubectl refused, or it was interrupted)."""
        return self.state == "failed"

    @property
    def object_name(self) -> str | None:
        """--target kubernetes: the name of the object applied."""
        name = (self.kubernetes or {}).get("name")
        return name if isinstance(name, str) else None


def read_submission(run_dir: Path) -> Submission:
    """The submission record; empty when there is none or it cannot be used (``app.runs``
    says which and why)."""
    found, _ = records.load_json(run_dir / SUBMISSION_FILE, dict, {})
    return Submission.from_json(found)


def job_ids(run_dir: Path) -> list[str]:
    return list(read_submission(run_dir).job_ids or ())


def write_submission(run_dir: Path, record: Submission) -> None:
    fsutil.atomic_write_json(run_dir / SUBMISSION_FILE, record.to_json(), 0o600)


def read_intent(run_dir: Path) -> Intent | None:
    """The intent; None when there is none or it cannot be used."""
    found, _ = records.load_json(run_dir / INTENT_FILE, dict, {})
    return Intent.from_json(found) if found else None


def write_intent(run_dir: Path, record: Intent) -> None:
    fsutil.atomic_write_json(run_dir / INTENT_FILE, record.to_json(), 0o600)
