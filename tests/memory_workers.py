"""Rank functions for ``test_memory_checkpoint.py`` (spawned by ``ckpt_dist.run_world``:
module-level, importable by name)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

RANKS_PER_NODE = 2


def _state(seed: int):  # type: ignore[no-untyped-def]
    import torch

    from ddlaunch.saving.manager import TrainState

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # momentum buffers
    return model, {"train": TrainState(model, opt), "extra": torch.tensor([seed])}


def _flat(model) -> list[list[float]]:  # type: ignore[no-untyped-def]
    return [p.detach().flatten().tolist() for p in model.parameters()]


def phase_restore(rank: int, world: int, out: str, fits: bool) -> None:
    """Every rank captures its state at step 20 (its own seed: the states differ), the save
    commits; then rank 1 becomes a replacement (a new model, nothing in RAM) and the world
    restores. Observed: the step restored (None: from disk), rank 1's parameters against
    its original's, what rank 0 printed."""
    from ddlaunch.saving import memory

    os.environ["LOCAL_WORLD_SIZE"] = str(RANKS_PER_NODE)
    if not fits:
        memory.available_bytes = lambda: 1024  # type: ignore[assignment]
    original, state = _state(rank)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        copies = memory.MemoryCheckpoint(RANKS_PER_NODE)
        kept = copies.capture(20, state)
    if copies.pending is not None:
        copies.pending[1].result()
    copies.commit(20)
    expected = _flat(original)
    if rank == 1:
        memory.forget()
        original, state = _state(100)  # the replacement's fresh model
    step = memory.restore(state, 20)
    Path(out, f"restore-{fits}-rank{rank}.json").write_text(
        json.dumps(
            {
                "kept": kept,
                "step": step,
                "same": _flat(original) == expected,
                "extra": int(state["extra"].item()),
                "said": said.getvalue(),
            }
        )
    )
    copies.close()
