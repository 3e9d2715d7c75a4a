"""What a submission says as it goes, as typed values (``app.submit_run``, ``app.resume_run``,
``sweeps.resubmit``): the use case yields them in order and the CLI prints each as it
comes, so that a warning is on the terminal before the sbatch that may hang or fail."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.snapshot import Snapshot
from ddlaunch.config.schema import Config


@dataclass(frozen=True)
class Warned:
    """A warning (``warning: <text>`` on stderr)."""

    text: str


@dataclass(frozen=True)
class Noted:
    """A line about what the submission does, not a warning (``submit --after`` leaving out
    an edge onto a run that has ended)."""

    line: str


@dataclass(frozen=True)
class Excluding:
    """The nodes the job keeps out, as one line."""

    line: str


@dataclass(frozen=True)
class CodeSnapshot:
    """The code the ranks will run (``stored``: taken and stored, not a dry run's path)."""

    config: Config
    snapshot: Snapshot | None
    stored: bool


@dataclass(frozen=True)
class DryRun:
    """What would be submitted: the script and the exact sbatch command line."""

    script: str
    sbatch_line: str


@dataclass(frozen=True)
class RunsLocally:
    """The ranks run here as local processes; ``asked``: --local, not a missing sbatch."""

    asked: bool


@dataclass(frozen=True)
class LocalRun:
    """The run directory is ready for the local run, which the caller starts (and streams)."""

    run_id: str
    run_dir: Path
    config: Config


@dataclass(frozen=True)
class Submitting:
    """Checked and prepared; sbatch runs once the caller asks for the next event."""


@dataclass(frozen=True)
class Accepted:
    """sbatch accepted the job."""

    run_id: str
    run_dir: Path
    job_id: str | None
