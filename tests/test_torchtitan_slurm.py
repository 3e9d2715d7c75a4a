"""torchtitan 0.3.0's own trainer (``torchtitan.train``: FSDP2 over gloo, its DCP checkpointer
and its resume; through ``trainer_scripts/torchtitan_cpu.py``, which applies the CPU shims) on
the real dev cluster with ``trainer.kind: torchtitan``, 2 nodes x 1 rank: a rank killed -9
after its ``step-20`` is complete -> restarted in the allocation (progress made), torchtitan
resumes by itself from the newest complete ``step-N`` (ddlaunch adds no argument) and
finishes; ddlaunch's attempt records, torchtitan's own log and ``status`` agree on the step.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch, wait_for
from support.slurm_runs import REPO, submit

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None,
        reason="torchtitan is not installed (scripts/test-all installs the torchtitan extra)",
    ),
]
SCRIPT = REPO / "tests" / "trainer_scripts" / "torchtitan_cpu.py"
STEPS, INTERVAL = 40, 10
# Nothing is downloaded (the model is built from a config, the tokenizer and the text are
# generated); one CPU thread per rank.
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def titan_config(tmp_path: Path, name: str) -> Path:
    args = [
        "{run_dir}/assets", "--dump_folder", "{run_dir}/titan", "--checkpoint.enable",
        "--checkpoint.interval", str(INTERVAL), "--training.steps", str(STEPS),
        "--dataloader.step_sleep", "0.3",
    ]  # fmt: skip
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 1, "cpus_per_task": 2},
        "launch": {
            "script": str(SCRIPT),
            "args": args,
            "backend": "gloo",
            "env": {**ENV, "TITAN_PID_DIR": str(tmp_path / "pids")},
        },
        # torchtitan writes <dump_folder>/checkpoint/step-N.
        "trainer": {"kind": "torchtitan", "checkpoint_dir": "{run_dir}/titan/checkpoint"},
        "fault_tolerance": {"max_requeues": 3},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def titan_losses(text: str) -> list[tuple[int, str]]:
    """(step, loss) as torchtitan's metrics log them on rank 0 (``step: N  loss: L ...``)."""
    return [(int(s), loss) for s, loss in re.findall(r" - step:\s+(\d+)\s+loss:\s+(\S+)", text)]


def titan_steps(text: str) -> list[int]:
    return [step for step, _ in titan_losses(text)]


def test_torchtitan_rank_killed_after_a_checkpoint_resumes_from_that_step(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    started = time.monotonic()
    job_id, run_dir = submit(titan_config(tmp_path, "titan-kill"), tmp_path, slurm_job_cleanup)
    ckpt = run_dir / "titan" / "checkpoint"
    log = run_dir / "logs" / "rank-0.out"

    def last_step() -> int:
        found = titan_steps(log.read_text()) if log.exists() else []
        return found[-1] if found else 0

    # step-20 complete (DCP's .metadata, written once every rank's shards are) and a step
    # past it trained: the kill falls between two checkpoints.
    wait_for(
        lambda: (ckpt / "step-20" / ".metadata").is_file() and last_step() > 20,
        240,
        "step-20 complete",
        poll=0.1,
    )
    os.kill(int((tmp_path / "pids" / "pid-1").read_text()), signal.SIGKILL)  # rank 1
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    print(f"submitted -> completed in {time.monotonic() - started:.1f} s")
    first, second = json.loads((run_dir / "attempts.json").read_text())
    assert (first["cause"], first["committed_step"]) == ("crash", 20)
    assert first["decision"] == (
        "restart in the allocation after crash: committed step none -> 20 (restart 1 of 3)"
    )
    assert second["in_allocation"] is True and second["cause"] == "completed"
    assert second["resumed_from"] == 20
    assert second["resume_checkpoint"] == str(ckpt / "step-20")
    assert second["committed_step"] == STEPS
    # ddlaunch added no argument: torchtitan found step-20 itself and went on from step 21.
    text = log.read_text()
    assert text.count("Training starts at step 1\n") == 1
    before, after = text.split(f"Loading the checkpoint from {ckpt}/step-20.", 1)
    assert "Training starts at step 21\n" in after
    cut_short, again = titan_losses(before), titan_losses(after)
    assert [s for s, _ in cut_short][:21] == list(range(1, 22)) and cut_short[-1][0] < 30
    assert [s for s, _ in again] == list(range(21, STEPS + 1))
    # The weights, optimizer and data position of step 20: the steps the first attempt ran
    # past step-20 (lost with the kill) come out with the same losses.
    lost = [s for s in cut_short if s[0] > 20]
    assert lost and lost == again[: len(lost)]
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step-{n}" for n in (10, 20, 30, 40)]
    row = json.loads(run_ddlaunch("status", run_dir.name, "--json", cwd=tmp_path).stdout)[0]
    assert (row["state"], row["checkpoint_step"], row["attempts"]) == ("COMPLETED", STEPS, 2)
    assert row["step"] == STEPS
