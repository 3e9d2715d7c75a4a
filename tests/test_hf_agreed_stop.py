"""Hugging Face's JIT checkpoint with ranks whose stop timers disagree, through the local
runner (real rank processes, gloo on 127.0.0.1, CPU, the unmodified HF Trainer example: a
tiny GPT-2 built from a config, generated data, ``--enable_jit_checkpoint``).

transformers starts a 3 s timer per rank on SIGTERM and, left alone, saves at whichever
callback each rank reaches next (``transformers.trainer_jit_checkpoint``): a rank in the
save's collectives and a rank in the next step's DDP all-reduce deadlock, or gloo aborts on
the mismatched sizes (tests/FLAKES.md). Here the disagreement is made certain: TERM reaches
one rank only, or the two ranks 1.5 s apart (a step takes ~0.25 s, so their timers fire
steps apart). ddlaunch's agreed stop step (``ddlaunch.worker.hf_stop``, installed by the rank
for ``trainer.kind: hf``) must turn that into what a stop should be: both ranks exit 0, and
one complete checkpoint, at the step the ranks stopped at, written by both ranks.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from support.hf_runs import MAX_STEPS, hf_run
from support.local_runs import finished, signal_while_training, start

from ddlaunch.worker import hf_stop, rank_agreement


@pytest.mark.parametrize(
    ("world_size", "delays"),
    [(2, {1: 0.0}), (2, {0: 0.0, 1: 1.5}), (1, {0: 0.0})],
    ids=["rank-1-only", "rank-0-then-rank-1-1.5s-later", "one-rank"],
)
def test_every_rank_saves_the_jit_checkpoint_at_the_same_step(
    tmp_path: Path, world_size: int, delays: dict[int, float]
) -> None:
    run = hf_run(tmp_path)
    thread, outcome = start(run, world_size)
    signalled_at = signal_while_training(run, (thread, outcome), delays, signal.SIGTERM, 3)
    finished(run, thread, outcome)

    checkpoints = sorted(p.name for p in (tmp_path / "ckpts").glob("checkpoint-*"))
    assert len(checkpoints) == 1, checkpoints  # the JIT one; no periodic or final save
    step = int(checkpoints[0].split("-")[1])
    assert signalled_at <= step < MAX_STEPS
    checkpoint = tmp_path / "ckpts" / checkpoints[0]
    files = {p.name for p in checkpoint.iterdir()}
    # HF's layout: complete once trainer_state.json is written and the sentinel is gone
    # (ddlaunch's trainer.kind hf); one RNG state per rank: every rank saved this step.
    assert {"trainer_state.json", "model.safetensors", "optimizer.pt"} <= files, files
    rng = {"rng_state.pth"} if world_size == 1 else {f"rng_state_{r}.pth" for r in (0, 1)}
    assert rng <= files, files
    assert "checkpoint-is-incomplete.txt" not in files
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == step
    result = json.loads((run / "result.json").read_text())
    assert result["world_size"] == world_size
    if world_size == 1:  # transformers' own: a save before the optimizer step runs that step
        assert result["global_step"] in (step, step + 1)
    else:  # rank 0 stopped at the saved step, and so did rank 1 (it exited 0)
        assert result["global_step"] == step


def test_without_a_signal_the_trainer_saves_as_it_would_alone(tmp_path: Path) -> None:
    """No stop: the periodic saves and the final one, nothing more, and training to the end
    (the per-step all-reduce of the flags only reads)."""
    run = hf_run(tmp_path, max_steps=8, save_steps=3, step_sleep=0.0)
    thread, outcome = start(run, 2)
    finished(run, thread, outcome)
    checkpoints = sorted(p.name for p in (tmp_path / "ckpts").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]
    assert json.loads((run / "result.json").read_text())["global_step"] == 8


class FakeManager:
    """transformers' CheckpointManager as the callback sees it: the flag, and the save."""

    def __init__(self, requested: bool) -> None:
        self.is_checkpoint_requested = requested
        self.saved_at: list[int] = []
        self.state: Any = None

    def execute_jit_checkpoint(self) -> None:
        self.is_checkpoint_requested = False
        assert self.state is not None
        self.saved_at.append(self.state.global_step)


@pytest.fixture
def callback(monkeypatch: pytest.MonkeyPatch) -> type:
    """transformers' JITCheckpointCallback, patched for this test only."""
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    for name in HOOKS:
        monkeypatch.setattr(JITCheckpointCallback, name, getattr(JITCheckpointCallback, name))
    monkeypatch.setattr(JITCheckpointCallback, "_ddlaunch_agreed", False, raising=False)
    assert hf_stop.agree_on_the_stop_step()
    patched = {name: getattr(JITCheckpointCallback, name) for name in HOOKS}
    assert hf_stop.agree_on_the_stop_step()  # once only
    assert patched == {name: getattr(JITCheckpointCallback, name) for name in HOOKS}
    return JITCheckpointCallback


HOOKS = ("on_step_begin", "on_pre_optimizer_step", "on_step_end", "on_epoch_end")


def test_one_process_keeps_transformers_own_callbacks(callback: type) -> None:
    """No process group: nothing to agree with, HF saves where it would (mid-step too)."""
    from transformers.trainer_callback import TrainerControl, TrainerState

    for hook in HOOKS:
        cb = callback()
        cb.jit_manager = manager = FakeManager(requested=True)
        state, control = TrainerState(global_step=5), TrainerControl()
        manager.state = state
        getattr(cb, hook)(None, state, control)
        assert manager.saved_at == [5], hook
        assert control.should_training_stop
        cb.jit_manager = manager = FakeManager(requested=False)
        manager.state = state
        getattr(cb, hook)(None, state, TrainerControl())
        assert manager.saved_at == [], hook


def test_several_ranks_save_at_the_agreed_step_end_once(
    callback: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.trainer_callback import TrainerControl, TrainerState

    reduced: list[bool] = []
    others = [False]  # the other ranks' flags, as the MAX all-reduce would see them

    def any_rank(flag: bool) -> bool:
        reduced.append(flag)
        return flag or others[0]

    monkeypatch.setattr(rank_agreement, "several_ranks", lambda: True)
    monkeypatch.setattr(rank_agreement, "any_rank", any_rank)
    cb = callback()
    cb.jit_manager = manager = FakeManager(requested=True)
    state, control = TrainerState(global_step=7), TrainerControl()
    manager.state = state
    cb.on_step_begin(None, state, control)  # mid-step: never, whatever this rank's flag
    cb.on_pre_optimizer_step(None, state, control)
    assert manager.saved_at == [] and reduced == [] and not control.should_training_stop
    manager.is_checkpoint_requested = False
    cb.on_step_end(None, state, control)  # no rank asks: one all-reduce, no save
    assert manager.saved_at == [] and reduced == [False]
    others[0] = True  # another rank's timer fired: this rank saves too
    control.should_save = True  # a periodic save due at this step: the JIT one replaces it
    cb.on_step_end(None, state, control)
    assert manager.saved_at == [7] and control.should_training_stop and not control.should_save
    # This rank's own timer fires during the save; the epoch end that follows at the same
    # step (every rank reaches it) neither saves again nor reduces.
    manager.is_checkpoint_requested = True
    cb.on_epoch_end(None, state, control)
    assert manager.saved_at == [7] and reduced == [False, False]
