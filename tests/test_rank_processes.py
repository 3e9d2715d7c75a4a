"""The one supervisor of ranks ddlaunch starts itself (a local run, a Kubernetes pod):
output appended per rank, a stop that asks first and kills the rank's whole group after."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ddlaunch.rank_processes import Stopped, start_rank, stop_ranks

# A rank that starts a worker of its own (as a data loader does), writes the worker's pid,
# and either leaves on SIGTERM or ignores it.
RANK = """
import signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(worker.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie child of an exited rank is reaped by init; until then it is not running.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1].startswith("Z")


def _worker_pid(logs: Path, rank: int, line: int = 0) -> int:
    """The pid the rank printed on ``line`` of its output (lines before it are older)."""
    out = logs / f"rank-{rank}.out"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines()
        if len(lines) > line:
            return int(lines[line])
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} never started its worker")


def test_a_rank_that_ignores_the_stop_request_is_killed_after_the_grace_with_its_worker(
    tmp_path: Path,
) -> None:
    rank = start_rank([sys.executable, "-c", RANK, "ignore"], dict(os.environ), tmp_path, 0)
    worker = _worker_pid(tmp_path, 0)
    began = time.monotonic()
    assert stop_ranks([rank], grace_s=1.0) == Stopped(asked=1, killed=1)
    took = time.monotonic() - began
    assert rank.returncode == -9
    assert 1.0 <= took < 10
    deadline = time.monotonic() + 5
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker), "the rank's worker outlived the stop"


def test_a_rank_that_leaves_on_the_request_is_not_waited_for_and_output_is_appended(
    tmp_path: Path,
) -> None:
    (tmp_path / "rank-3.out").write_text("earlier attempt\n")
    rank = start_rank([sys.executable, "-c", RANK, "leave"], dict(os.environ), tmp_path, 3)
    worker = _worker_pid(tmp_path, 3, line=1)
    began = time.monotonic()
    assert stop_ranks([rank], grace_s=30.0) == Stopped(asked=1, killed=0)
    assert time.monotonic() - began < 10
    assert stop_ranks([rank], grace_s=30.0) == Stopped()  # none left to ask
    assert rank.returncode == -15
    assert (tmp_path / "rank-3.out").read_text().startswith("earlier attempt\n")
    deadline = time.monotonic() + 5
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker), "the rank's worker outlived the stop"
