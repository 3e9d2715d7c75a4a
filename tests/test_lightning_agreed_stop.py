"""Lightning's save on the stop signal with ranks that receive it at different moments,
through the local runner (real rank processes, gloo on 127.0.0.1, CPU, the unmodified
Lightning example as the task of a Slurm job: ``trainer_scripts/lightning_as_slurm_task.py``).

Lightning saves ``hpc_ckpt_N.ckpt`` inside its SIGUSR1 handler, on each rank wherever the
signal finds it; the save is a collective, so a rank in the save and a rank in the next step's
gradient all-reduce deadlock (tests/FLAKES.md, on the dev cluster). Here the disagreement is
made certain: USR1 reaches one rank only, or the two ranks 1.5 s apart (a step takes ~0.1 s).
ddlaunch's agreed stop step (``ddlaunch.worker.lightning_stop``, installed by the rank for
``trainer.kind: lightning``) must turn that into what a stop should be: one complete
``hpc_ckpt``, saved by every rank at the same step, one ``scontrol requeue`` of the job from
rank 0, and the ranks go on (Slurm, which would end them on the requeue, is not here) to the
end with exit 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from support.local_runs import finished, signal_while_training, start

from ddlaunch.config import Config, load_config, to_plain

SCRIPTS = Path(__file__).parent / "trainer_scripts"
AS_SLURM_TASK = SCRIPTS / "lightning_as_slurm_task.py"
JOB_ID = "4242"
MAX_STEPS = 40
STEP_SLEEP_S = 0.1
TIMEOUT_S = 60.0  # start-up (Lightning's import on 2 cores: ~10 s), 40 steps, the save


def pl_run(tmp_path: Path, world_size: int) -> Path:
    """A run directory of the example as a Slurm task, with an ``scontrol`` on PATH that only
    records its arguments (one line per call)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    cfg: Config = load_config("examples/lightning")
    args = (
        "lightning_train.py", "--root", str(tmp_path / "ckpts"), "--max_steps", str(MAX_STEPS),
        "--nodes", str(world_size), "--devices", "1", "--step_sleep", str(STEP_SLEEP_S),
        "--result", "{run_dir}/result.json",
    )  # fmt: skip
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "LOCAL_SLURM_JOB_ID": JOB_ID}
    launch = dataclasses.replace(
        cfg.launch, script=str(AS_SLURM_TASK), module=None, args=args, env=env
    )
    cfg = dataclasses.replace(cfg, launch=launch)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    return run


@pytest.mark.parametrize(
    ("world_size", "delays"),
    [(2, {1: 0.0}), (2, {0: 0.0, 1: 1.5}), (1, {0: 0.0})],
    ids=["rank-1-only", "rank-0-then-rank-1-1.5s-later", "one-rank"],
)
def test_every_rank_saves_lightnings_hpc_checkpoint_at_the_same_step_and_requeues_once(
    tmp_path: Path, world_size: int, delays: dict[int, float]
) -> None:
    run = pl_run(tmp_path, world_size)
    thread, outcome = start(run, world_size, TIMEOUT_S)
    signalled_at = signal_while_training(
        run, (thread, outcome), delays, signal.SIGUSR1, 5, TIMEOUT_S
    )
    finished(run, thread, outcome, TIMEOUT_S)

    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["hpc_ckpt_1.ckpt"]
    saved = torch.load(tmp_path / "ckpts" / "hpc_ckpt_1.ckpt", weights_only=False)
    assert signalled_at <= saved["global_step"] < MAX_STEPS
    assert (tmp_path / "scontrol.calls").read_text() == f"requeue {JOB_ID}\n"
    result = json.loads((run / "result.json").read_text())
    assert (result["world_size"], result["global_step"]) == (world_size, MAX_STEPS)
    said = [
        line
        for line in (run / "logs" / "rank-0.out").read_text().splitlines()
        if line.startswith("[ddlaunch] every rank saves")
    ]
    if world_size == 1:  # Lightning's own handler, in the signal handler, as it was
        assert said == []
    else:  # the step the checkpoint holds is the one every rank agreed on
        assert said == [
            f"[ddlaunch] every rank saves on the stop signal at step {saved['global_step']} "
            "(Lightning's hpc checkpoint, then its requeue)"
        ]
