"""The steps of trainers ddlaunch does not drive reach the heartbeats (``trainer.kind: hf``,
``lightning``; ``ddlaunch.worker.trainer_beats``): the unmodified example scripts through the
local runner (real rank processes, CPU, gloo on 127.0.0.1), and the beats the ranks leave.

Before, such a run left no heartbeat at all: ``status`` showed its latest checkpoint's step
only, which stood still between saves and after the last one, and the watchdog judged no
hang."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import yaml
from support.hf_runs import hf_run
from support.local_runs import finished, start

from ddlaunch.config import Config, load_config, to_plain
from ddlaunch.store.heartbeats import read_heartbeats
from ddlaunch.worker import trainer_beats
from ddlaunch.worker.heartbeat import Heartbeat

LIGHTNING = Path(trainer_beats.__file__).parents[1] / "examples" / "lightning_train.py"


def final_beats(run: Path) -> dict[int, tuple[int | None, str]]:
    return {int(b["rank"]): (b.get("step"), str(b.get("state"))) for b in read_heartbeats(run)}


def test_every_hf_rank_beats_each_trainer_step_and_closes(tmp_path: Path) -> None:
    # 8 steps, saves at 3 and 6 (and the final one): the checkpoint step alone said 6 for
    # most of the run, and the beats say where training is.
    run = hf_run(tmp_path, max_steps=8, save_steps=3, step_sleep=0.0)
    thread, outcome = start(run, 2)
    finished(run, thread, outcome)
    assert final_beats(run) == {0: (8, "closed"), 1: (8, "closed")}


def test_a_lightning_rank_beats_each_optimizer_step_and_closes(tmp_path: Path) -> None:
    cfg: Config = load_config("examples/lightning")
    args = ("--root", str(tmp_path / "ckpts"), "--max_steps", "12", "--nodes", "1")
    launch = dataclasses.replace(cfg.launch, script=str(LIGHTNING), module=None, args=args)
    cfg = dataclasses.replace(cfg, launch=launch)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    thread, outcome = start(run, 1)
    finished(run, thread, outcome)
    assert final_beats(run) == {0: (12, "closed")}


def test_progress_that_is_not_a_step_counts_for_the_hang_rule_and_not_as_step_time(
    tmp_path: Path,
) -> None:
    beat = Heartbeat(tmp_path, 0, interval=60.0, job_id="1", local_dir=tmp_path / "local")
    beat.step(4)
    time.sleep(0.01)
    beat.step(5)
    before = beat.snapshot()
    assert before["step_time"] is not None
    time.sleep(0.01)
    beat.progress()  # an evaluation batch
    after = beat.snapshot()
    assert after["step"] == 5 and after["step_time"] == before["step_time"]
    assert (after["step_wall"] or 0) > (before["step_wall"] or 0)


@pytest.mark.parametrize("kind", ["none", "dcp", "torchtune"])
def test_kinds_without_hooks_start_no_heartbeat(tmp_path: Path, kind: str) -> None:
    cfg: Config = load_config("examples/hf-trainer", [f"trainer.kind={kind}"])
    assert trainer_beats.start(cfg, tmp_path, 0) is None
    assert not list(tmp_path.rglob("*.jsonl"))
