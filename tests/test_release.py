"""Releases: the version is the changelog's newest release, and a run directory written by
the previous release is still read by this one.

``tests/fixtures/rundir-0.1.0/`` is a run of release 0.1.0 (the code at 3ae96fc) on the dev
cluster, kept as it wrote it: the example MLP on 2 nodes x 2 ranks, 80 steps, a checkpoint
every 20, rank 1 killed with SIGKILL after step 40, restarted in the allocation from step 40,
completed. A release that changes the run directory's format keeps such a test for the
release before it, and says so in CHANGELOG.md's upgrade notes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes import FakeRunner, ok

import ddlaunch
from ddlaunch.app.logs import failing_rank
from ddlaunch.app.runs import read_run
from ddlaunch.app.status_poll import Target, poll
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts
from ddlaunch.store.rundir import committed_step, latest_checkpoint

REPO = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "rundir-0.1.0"
RUN_ID = "release-0.1.0-20261207-102044-e3a5d760"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A copy: reading a run may cache its final state beside it."""
    shutil.copytree(FIXTURE, tmp_path / "runs")
    return tmp_path / "runs" / RUN_ID


def test_status_reads_the_previous_releases_run(run: Path) -> None:
    # The job left the queue long ago, and accounting forgot it: the directory says it all.
    runner = FakeRunner({"squeue": ok(""), "sacct": ok("")})
    (row,) = poll([Target(run)], SlurmClient(runner))
    assert (row.run_id, row.job_id, row.state) == (RUN_ID, "2", "COMPLETED")
    assert (row.step, row.checkpoint_step, row.attempts) == (80, 80, 2)
    assert row.problems == [], row.problems  # every record read
    first, second = row.history
    assert (first["cause"], first["committed_step"]) == ("crash", 40)
    assert first.get("culprit") == "rank 1 on node1 killed by SIGKILL"
    assert (second["cause"], second["resumed_from"]) == ("completed", 40)
    assert second.get("in_allocation") is True


def test_the_typed_records_and_the_checkpoints_read(run: Path) -> None:
    first, second = attempts.load(run)
    assert (first.cause, second.cause) == ("crash", "completed")
    assert latest_checkpoint(run) is not None and committed_step(run) == 80
    info = read_run(run)
    assert info.job_id == "2" and failing_rank(info) is None  # it completed: no rank failed


def test_the_version_is_the_changelogs_newest_release() -> None:
    """``ddlaunch --version`` and the wheel say ``__version__``; CHANGELOG.md's first release
    heading below "Unreleased" names it, with its date, and no release is named twice."""
    headings = [
        line.removeprefix("## ")
        for line in (REPO / "CHANGELOG.md").read_text().splitlines()
        if line.startswith("## ")
    ]
    assert headings[0] == "Unreleased", headings
    releases = [h.split(" - ") for h in headings[1:]]
    assert all(len(r) == 2 and re.fullmatch(r"\d{4}-\d\d-\d\d", r[1]) for r in releases), releases
    versions = [r[0] for r in releases]
    assert versions[0] == ddlaunch.__version__, (versions, ddlaunch.__version__)
    assert len(set(versions)) == len(versions), versions
    assert re.fullmatch(r"\d+\.\d+\.\d+", ddlaunch.__version__)


def test_status_of_a_run_directory_where_no_slurm_is_installed(run: Path) -> None:
    """A run directory read on a host without Slurm's commands (copied off the cluster):
    ``status`` shows what the directory knows and says why Slurm was not asked, instead of
    failing on the missing squeue."""
    env = {
        **os.environ,
        "PATH": str(run.parent / "no-commands-here"),
        "DDLAUNCH_RUN_ROOT": str(run.parent),
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "status"],
        capture_output=True,
        text=True,
        env=env,
        cwd=run.parent,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    row = proc.stdout.splitlines()[1]
    assert row.split()[:7] == [RUN_ID, "2", "COMPLETED", "node[1-2]", "80", "80", "2"], row
    assert "no Slurm here (squeue: command not found)" in row, row
