"""Hugging Face Trainer runs through the local runner (real rank processes, gloo on 127.0.0.1,
CPU): a run directory of the HF example script (through ``trainer_scripts/example_with_pid.py``:
a tiny GPT-2 built from a config, generated data, ``--enable_jit_checkpoint``, offline); run it
with ``support.local_runs``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from ddlaunch.config import Config, load_config, to_plain

WITH_PID = Path(__file__).parent.parent / "trainer_scripts" / "example_with_pid.py"
MAX_STEPS = 400  # ~100 s of steps: the stop, not the end of training, must end the run
STEP_SLEEP_S = 0.25
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def hf_run(
    tmp_path: Path,
    max_steps: int = MAX_STEPS,
    save_steps: int = 10 * MAX_STEPS,
    step_sleep: float = STEP_SLEEP_S,
) -> Path:
    cfg: Config = load_config("examples/hf-trainer")
    args = (
        "hf_trainer.py", "--output_dir", "{checkpoint_dir}", "--max_steps", str(max_steps),
        "--save_steps", str(save_steps), "--step_sleep", str(step_sleep),
        "--enable_jit_checkpoint", "--result", "{run_dir}/result.json",
    )  # fmt: skip
    launch = dataclasses.replace(
        cfg.launch, script=str(WITH_PID), module=None, args=args, env={**cfg.launch.env, **OFFLINE}
    )
    trainer = dataclasses.replace(cfg.trainer, checkpoint_dir=str(tmp_path / "ckpts"))
    cfg = dataclasses.replace(cfg, launch=launch, trainer=trainer)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    return run
