"""The tutorial (docs/tutorial.md) on the real dev cluster: its step 4 command as the page
writes it, the second node killed as step 6 says, before the first checkpoint, and the end the
page promises: the run goes on by itself on the hot spare, inside the allocation, and
completes. The page's own lines (the command, the batch log it quotes) are read from it, so
the page and this test cannot drift apart."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
from support.devcluster import DevCluster, wait_for
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import REPO, attempts, committed, job_of, result

from ddlaunch.config.slurm_defects import GRES_STEP_ON_LOST_NODE
from ddlaunch.config.slurm_release import version_tuple
from ddlaunch.store.outcome import read_outcome
from ddlaunch.store.progress import PROGRESS_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]

PAGE = REPO / "docs" / "tutorial.md"
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
# The page's node names (the batch host, the node it kills, the spare).
PAGE_NODES = ("node1", "node2", "node3")


def block_after(marker: str) -> list[str]:
    """The lines of the page's first fenced block after ``marker``, stripped."""
    text = PAGE.read_text()
    at = text.index(marker)
    lines = text[at:].splitlines()
    opening = next(i for i, line in enumerate(lines) if line.strip().startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].strip() == "```")
    return [line.strip() for line in lines[opening + 1 : closing] if line.strip()]


def step4_argv() -> list[str]:
    """Step 4's command line (``\\`` continuations joined), without ``ddlaunch``."""
    command = " ".join(line.rstrip("\\").strip() for line in block_after("## 4. Submit"))
    argv = shlex.split(command)
    assert argv[:3] == ["ddlaunch", "submit", "examples/mlp"], argv
    return argv[1:]


def on_this_cluster(line: str, names: dict[str, str]) -> str:
    """A line the page quotes, with the page's node names put as this run's."""
    return re.sub(r"\bnode\d+\b", lambda m: names.get(m.group(), m.group()), line)


def training_step(run_dir: Path) -> int:
    """The step rank 0 reached last (``progress.json``, a few times a minute); -1 before."""
    try:
        return int(json.loads((run_dir / PROGRESS_FILE).read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return -1


@pytest.mark.lane
def test_the_tutorial_run_goes_on_on_the_spare_when_a_node_dies_before_any_checkpoint(
    slurm_cluster: DevCluster, slurm_job_cleanup: list[str], tmp_path: Path
) -> None:
    if version_tuple(slurm_cluster.release) in GRES_STEP_ON_LOST_NODE:
        pytest.skip(
            f"Slurm {slurm_cluster.release}: a GPU step on a lost node can crash the controller "
            "(ddlaunch.config.slurm_defects); the tutorial is written for 22.05"
        )
    proc = ddlaunch(*step4_argv(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id, job_id = job_of(proc.stdout)
    slurm_job_cleanup.append(job_id)
    run_dir = tmp_path / "runs" / run_id
    # Training runs (step 6: "any time once the run trains"), the first checkpoint (step 50,
    # examples/mlp's checkpoint_every_steps) not committed yet: the case a restart used to
    # refuse for want of progress.
    wait_for(lambda: training_step(run_dir) >= 10, 240, "training step 10", poll=0.2)
    assert committed(run_dir) == -1, "a checkpoint committed before the kill"
    opened = attempts(run_dir)[0]
    used = slurm_cluster.hostnames(opened["nodes"])
    (spare,) = opened["spares"]
    assert len(used) == 2 and spare not in used, opened
    victim = used[1]  # the second node, not the batch host (step 6)
    killed_at = time.monotonic()
    slurm_cluster.kill_node(victim)
    try:
        state = slurm_cluster.wait_job_state(job_id, FINAL_STATES, timeout=300)
    finally:
        slurm_cluster.revive_node(victim)
    print(f"kill -> {state} in {time.monotonic() - killed_at:.1f} s")
    ended = read_outcome(run_dir)
    assert state == "COMPLETED", (state, ended)
    assert ended is not None and ended.state == "COMPLETED", ended
    assert slurm_cluster.job_field(job_id, "Restarts") == "0"  # never requeued
    first, second = attempts(run_dir)
    assert first["cause"] == "node failure" and first["blamed"] == [victim], first
    assert first["committed_step"] is None, first  # killed before any checkpoint
    assert first["decision"] == (
        "restart in the allocation after node failure: committed step none -> none, "
        f"without {victim} (restart 1 of 3)"
    ), first
    assert second["in_allocation"] is True and second["restart_cause"] == "node failure"
    assert slurm_cluster.hostnames(second["nodes"]) == [used[0], spare], second
    assert second["resumed_from"] is None, second  # from scratch
    res = result(run_dir)
    assert (res["start_step"], res["steps"]) == (0, 300), res  # the config's last step
    # The batch log says what the page quotes, in this run's node names.
    names = dict(zip(PAGE_NODES, (used[0], victim, spare), strict=True))
    log = (run_dir / "logs" / f"batch-{job_id}.out").read_text()
    quoted = block_after("killed before the first checkpoint:")
    assert len(quoted) == 3, quoted
    for line in quoted:
        assert on_this_cluster(line, names) in log, (line, log)
    assert f"[ddlaunch] {first['decision']}" in log
