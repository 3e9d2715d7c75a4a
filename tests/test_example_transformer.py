"""The FSDP2 + tensor-parallel example on CPU/gloo through the local runner: the same losses as
one plain process, and a resume on another plan that continues exactly (DCP reshards)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.rundirs import loaded_run_dir

from ddlaunch.launch.local import run_local

STEPS, MORE = 30, 40
# Measured: dp 2 x tp 2 and one process agree to ~1e-7 on the eval loss (reduction order);
# 1e-4 is far below what a wrong gradient, a lost shard or a skipped step changes (> 1e-2).
TOLERANCE = 1e-4


def run(run_dir: Path, world: int, *overrides: str) -> dict:
    every_10 = "fault_tolerance.checkpoint_every_steps=10"
    loaded_run_dir(run_dir, "examples/fsdp-tp", *overrides, every_10)
    run_local(run_dir, world_size=world, timeout_s=300)
    return json.loads((run_dir / "result.json").read_text())


SINGLE = ("nodes.count=1", "nodes.gpus_per_node=1", "parallel.dp=1", "parallel.tp=1")


@pytest.mark.timeout(600)
def test_dp2_tp2_matches_one_process_and_resumes_on_dp2_tp1(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        ref_job = pool.submit(run, tmp_path / "ref", 1, *SINGLE, f"params.steps={MORE}")
        sharded = run(tmp_path / "run", 4, f"params.steps={STEPS}")
        reference = ref_job.result()
    assert sharded["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert reference["initial_loss"] > 3.0  # ~ln 32 untrained
    assert abs(sharded["final_loss"] - reference["losses"][str(STEPS)]) < TOLERANCE
    assert reference["final_loss"] < 1.2  # it learns (the chain's floor is ~0.84)
    # tp peers share a host, and the coordinates are the plan's.
    by_rank = {p["rank"]: p for p in sharded["placement"]}
    assert [by_rank[r]["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [by_rank[r]["dp_shard"] for r in range(4)] == [0, 0, 1, 1]

    # Same run directory, another plan: 2 ranks, no tensor parallelism.
    resumed = run(
        tmp_path / "run",
        2,
        "nodes.count=1",
        "parallel.dp=2",
        "parallel.tp=1",
        f"params.steps={MORE}",
    )
    assert resumed["start_step"] == STEPS
    assert resumed["mesh"]["tp"] == 1 and resumed["mesh"]["dp_shard"] == 2
    # The restored state is the saved one (resharded), and training continues on the path
    # the single process took.
    assert abs(resumed["losses"][str(STEPS)] - sharded["final_loss"]) < TOLERANCE
    assert abs(resumed["final_loss"] - reference["final_loss"]) < TOLERANCE
