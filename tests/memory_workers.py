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
    memory.promote()
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


def _ptrs(tensors) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(t.untyped_storage().data_ptr() for t in tensors)


def _values(copy) -> list[list[float]]:  # type: ignore[no-untyped-def]
    from ddlaunch.saving.cpu_copy import _tensors

    return [t.flatten().tolist() for t in _tensors(copy)]


def phase_slots(rank: int, world: int, out: str, async_save: bool) -> None:
    """The own copies' two slots: allocated by prepare, reused by every save (the same
    buffers), the committed copy untouched by the next save until it commits, and by
    training after a restore from it; a new Session's copies (after an in-process restart)
    take the committed copy over as one of their slots. With ``async_save``, the copy is
    made from the save's staged copy (CheckpointManager.copy_staged)."""
    import torch

    from ddlaunch.saving import memory
    from ddlaunch.saving.cpu_copy import _tensors
    from ddlaunch.saving.manager import CheckpointManager

    os.environ["LOCAL_WORLD_SIZE"] = str(RANKS_PER_NODE)
    memory.forget()
    model, state = _state(rank)
    opt = state["train"].optimizers[0]
    manager = CheckpointManager(Path(out, f"ckpt-{async_save}"), keep_last=0, async_save=async_save)
    manager.load_latest(state)  # a fresh run: prepares the staging buffers
    copies = memory.MemoryCheckpoint(RANKS_PER_NODE)
    seen: dict[str, object] = {"prepared": copies.prepare(state)}
    slots = [_ptrs(slot.tensors()) for slot in copies.slots]
    staging = _ptrs(manager._stager.tensors()) if manager._stager else []
    expected: dict[int, list[list[float]]] = {}

    def train(seed: int) -> None:
        torch.manual_seed(seed)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()

    def save(step: int) -> None:
        manager.save(step, state)
        copies.capture(step, state, manager.copy_staged)
        expected[step] = _values(memory.plain_state(state))  # the state at the save
        manager.wait()
        assert copies.pending is not None
        copies.pending[1].result()

    save(10)
    memory.promote()
    train(1)
    save(20)  # not committed in RAM yet: the committed copy must still be step 10's
    seen["committed_kept_during_next_save"] = _values(memory.held().own) == expected[10]  # type: ignore[union-attr]
    memory.promote()
    seen["committed_is_20"] = _values(memory.held().own) == expected[20]  # type: ignore[union-attr]
    train(2)
    save(30)
    memory.promote()
    seen["same_buffers"] = [_ptrs(slot.tensors()) for slot in copies.slots] == slots
    seen["staging_reused"] = (
        _ptrs(manager._stager.tensors()) == staging if manager._stager else None
    )
    # An in-process restart: every rank from its own copy, then training goes on.
    train(3)
    step = memory.restore(state, 30)
    seen["restored"] = step
    seen["restored_equal"] = _values(memory.plain_state(state)) == expected[30]
    train(4)
    seen["committed_untouched_by_training"] = _values(memory.held().own) == expected[30]  # type: ignore[union-attr]
    committed = _ptrs(_tensors(memory.held().own))  # type: ignore[union-attr]
    after = memory.MemoryCheckpoint(RANKS_PER_NODE)  # the next Session's
    after.prepare(state)
    seen["restart_adopts_committed"] = _ptrs(after.slots[0].tensors()) == committed
    Path(out, f"slots-{async_save}-rank{rank}.json").write_text(json.dumps(seen))
    after.close()
    copies.close()
    manager.close()


def phase_memory_point(rank: int, world: int, out: str) -> None:
    """Copies at a save (step 20, on disk) and at a memory point (step 25, in RAM only),
    training between them; then rank 1 is replaced and the world restores with the disk's
    latest at 20. Observed: the step restored and whether each rank's state is its state of
    step 25, bit for bit (rank 1's from rank 3's RAM)."""
    import torch

    from ddlaunch.saving import memory

    os.environ["LOCAL_WORLD_SIZE"] = str(RANKS_PER_NODE)
    memory.forget()
    model, state = _state(rank)
    opt = state["train"].optimizers[0]
    copies = memory.MemoryCheckpoint(RANKS_PER_NODE)
    copies.prepare(state)
    for step in (20, 25):
        torch.manual_seed(rank * 100 + step)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        copies.capture(step, state)
        memory.promote()  # no-op while the transfer is on its way
    expected = _values(memory.plain_state(state))
    if rank == 1:
        memory.forget()
        model, state = _state(100)  # the replacement's fresh model
    else:
        with torch.no_grad():  # the survivors trained on past step 25 before the failure
            for p in model.parameters():
                p.add_(1.0)
    step = memory.restore(state, 20)
    Path(out, f"point-rank{rank}.json").write_text(
        json.dumps({"step": step, "same": _values(memory.plain_state(state)) == expected})
    )
    copies.close()
