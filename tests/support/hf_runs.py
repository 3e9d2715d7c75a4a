"""Hugging Face Trainer runs through the local runner (real rank processes, gloo on 127.0.0.1,
CPU): a run directory of the HF example script (through ``trainer_scripts/example_with_pid.py``:
a tiny GPT-2 built from a config, generated data, ``--enable_jit_checkpoint``, offline),
``run_local`` started in a thread, and the check that it ended with every rank stopped."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import yaml

from ddlaunch.config import Config, load_config, to_plain
from ddlaunch.launch.local import LocalRunError, run_local

WITH_PID = Path(__file__).parent.parent / "trainer_scripts" / "example_with_pid.py"
MAX_STEPS = 400  # ~100 s of steps: the stop, not the end of training, must end the run
STEP_SLEEP_S = 0.25
# Bounds the whole run (start, steps, the JIT save); run_local kills the ranks after it.
# Without the agreed step the ranks deadlock (until this), or gloo aborts (exit 134).
TIMEOUT_S = 60.0
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


def tails(run: Path) -> str:
    parts = []
    for log in sorted((run / "logs").glob("rank-*")):
        lines = log.read_text(errors="replace").splitlines()[-8:]
        parts.append(f"--- {log.name}\n" + "\n".join(lines))
    return "\n".join(parts)


def start(run: Path, world_size: int, timeout_s: float = TIMEOUT_S) -> tuple:
    """run_local in a thread: (the thread, the list its result or exception goes to)."""
    outcome: list[object] = []

    def launch() -> None:
        try:
            outcome.append(run_local(run, world_size=world_size, timeout_s=timeout_s))
        except BaseException as exc:  # reported by finished()
            outcome.append(exc)

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    return thread, outcome


def finished(run: Path, thread: threading.Thread, outcome: list[object]) -> None:
    thread.join(TIMEOUT_S + 15)  # run_local's own timeout kills the ranks before this
    assert outcome, "run_local did not return (the ranks were not stopped)"
    if isinstance(outcome[0], LocalRunError):
        pytest.fail(
            f"the ranks did not stop together ({outcome[0]}): a hang until the timeout, or "
            f"a collective mismatch\n{tails(run)}"
        )
    assert not isinstance(outcome[0], BaseException), outcome[0]
