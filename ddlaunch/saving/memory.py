"""The state of recent steps in RAM, this rank's and one peer's
(``fault_tolerance.restart: in_process``, ``memory_checkpoint: auto``).

At each save, and at every ``memory_every_steps``-th step between saves (a *memory point*),
every rank copies its state and sends the serialized bytes (what a replacement would need)
to its peer, the rank with the same local rank on the next node (``rank + ranks_per_node``,
modulo the world), receiving its predecessor's in turn: a ring over the nodes, so that a
dead node's ranks have their copies on a live one. The copies travel in the background; a
rank's copies of a step are *complete* once its own copy is made and its predecessor's has
arrived (``promote``). Memory points are more frequent than disk saves because they cost a
copy into buffers allocated at start and a transfer beside the training, not a write to
shared storage: an in-process restart then recomputes the steps since the last memory
point, not since the last save. The disk stays the source for requeues and whole-job
restarts; a restart in process may resume from a newer step than the disk holds.

Each rank keeps its two latest complete steps (``_committed`` and ``_previous``): the ranks
do not finish their transfers at the same moment, so at a failure one rank may hold step N
complete while another still has N's transfer on its way (the failure then ends it); the
older step is what they both hold.

After an in-process restart (``restore``), every rank of the new process group says which
steps it holds complete and whose copy it holds for each; the newest step, not older than
the disk's latest, for which every rank either holds its own copy or a survivor holds its
peer copy is restored: the survivors load their own bytes and each holder sends its copy to
the rank that lacks it (a replacement). Where no step qualifies every rank reads the
checkpoint from disk. Either way the result is the same state, bit for bit.

The copies live in this module, not in a ``Session``: a restart builds a new ``Session``
in the same process, and the copies must outlive the old one.

Not for sharded (DTensor) state: its shards are resharded by DCP on a load, which a byte
copy cannot do; ``auto`` is off there, with a line saying so.

Where the own copy lives. Two sets of CPU buffers per rank (``CpuCopy`` slots), allocated
and touched when the Session starts (``prepare``), never at a save: the newest complete
copy must stay untouched until the next one is complete (a restart in between resumes from
it), so the next copy goes to the other set, over the older complete step's copy (dropped
then: the newest is complete on this rank, and every rank waits for its newest transfer
before it starts the next). After an in-process restart the restored copy itself becomes
one of the new Session's two slots, so a restart allocates one set, not two.

With async saves the async save's staging buffers (``cpu_copy.ReusableCpuStager``) hold
the same state, but they cannot be the committed copy as well: they must hold step N
only until the next save starts, when that save stages step N+k over them, while step
N's committed copy must survive until N+k commits. So the own copy is copied *from* the
staging buffers, on the staging thread once the background copy is done
(``CheckpointManager.copy_staged``), instead of from the live state on the training
loop's thread: the save's stall gains nothing, and the next save's staging waits for
that copy first. With sync saves the copy from the live state is made inside the save,
into the warm slot.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from ddlaunch.saving.cpu_copy import CpuCopy
from ddlaunch.saving.state import TrainState

STATE_FROM_RAM = "ram"
STATE_FROM_DISK = "disk"
# The copies a rank holds at most: its own state of its two latest complete steps (two
# buffer sets) and its peer's serialized state of the same two steps.
COPIES = 4
# The copies of every rank of a node must fit in this share of its available memory.
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Held:
    """One step's copies: this rank's state (its tensors cloned to the CPU) and (``peer`` >=
    0) rank ``peer``'s, as the bytes it sent."""

    step: int
    own: dict[str, Any]
    peer: int
    peer_bytes: torch.Tensor | None


# This process's copies (they outlive a Session: see the module doc). ``_committed``: the
# newest step whose copies are complete here; ``_previous``: the one before it; ``_pending``:
# the step whose copies are on their way.
_committed: Held | None = None
_previous: Held | None = None
_pending: tuple[int, Future[Held]] | None = None
# How long a restart waits for a transfer that was on its way at the failure: the failure
# closed its connections, so it ends at once unless it was complete.
SETTLE_S = 2.0


def held() -> Held | None:
    """The newest complete copies, if any (this process's)."""
    return _committed


def kept() -> list[Held]:
    """The complete copies a restart may use, oldest first."""
    return [h for h in (_previous, _committed) if h is not None]


def forget() -> None:
    global _committed, _previous, _pending
    _committed = _previous = _pending = None


def promote(wait: float = 0.0) -> None:
    """The pending copies, once they are complete (waiting at most ``wait`` seconds), become
    the newest complete ones; the newest become the previous. A transfer that failed leaves
    the complete copies as they were."""
    global _committed, _previous, _pending
    if _pending is None:
        return
    future = _pending[1]
    if not future.done() and wait > 0:
        with contextlib.suppress(Exception):
            future.result(timeout=wait)
    if not future.done():
        return
    _pending = None
    if future.exception() is None:
        _previous, _committed = _committed, future.result()


def settled() -> bool:
    """Whether no transfer is on its way here. A memory point where one still is on any rank
    is skipped by every rank (``Session``), so a slow transfer (a large state, a busy
    network) makes the copies rarer instead of stalling the loop."""
    return _pending is None or _pending[1].done()


def memory_point(step: int, every: int) -> bool:
    """Whether ``step`` is a memory point (``fault_tolerance.memory_every_steps``; 0: the
    copies are taken at saves only). The same answer on every rank: no collective."""
    return every > 0 and step > 0 and step % every == 0


def peers(rank: int, world: int, ranks_per_node: int) -> tuple[int, int]:
    """(the rank this one sends its copy to, the rank whose copy it keeps); -1 when the
    world is one node (the copy would stay on the node it protects)."""
    if world <= ranks_per_node:
        return -1, -1
    return (rank + ranks_per_node) % world, (rank - ranks_per_node) % world


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return copy.deepcopy(value)


def plain_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state with its ``Stateful`` entries replaced by their state dicts (not copied)."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}


def nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def serialize(plain: Mapping[str, Any]) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(dict(plain), buffer)
    return torch.frombuffer(buffer.getbuffer(), dtype=torch.uint8)


def deserialize(data: torch.Tensor) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(
        io.BytesIO(data.numpy().data), weights_only=False, map_location="cpu"
    )
    return loaded


def load_into(state: dict[str, Any], plain: Mapping[str, Any]) -> None:
    """Put a copy back into the live state, as a load from disk would. The live state gets
    tensors of its own: an optimizer's ``load_state_dict`` keeps the tensors it is given
    (same dtype and device), and training would then change the committed copy in place."""
    for key, value in plain.items():
        target = state.get(key)
        if isinstance(target, Stateful):
            target.load_state_dict(_for_loading(target, value))
        elif isinstance(target, torch.Tensor):
            target.copy_(value)
        else:
            state[key] = _clone(value)


def _for_loading(target: Stateful, value: Any) -> Any:
    # A TrainState copies the model's entries into the parameters: only the rest (the
    # optimizers' state) needs tensors of its own.
    if isinstance(target, TrainState) and isinstance(value, Mapping) and "model" in value:
        return {k: v if k == "model" else _clone(v) for k, v in value.items()}
    return _clone(value)


def sharded(state: Mapping[str, Any]) -> bool:
    """Whether the state holds DTensor shards (FSDP2, tensor parallel)."""
    from torch.distributed.tensor import DTensor

    def walk(value: Any) -> bool:
        if isinstance(value, DTensor):
            return True
        if isinstance(value, Mapping):
            return any(walk(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(walk(v) for v in value)
        return False

    return any(walk(v.state_dict() if isinstance(v, Stateful) else v) for v in state.values())


def available_bytes() -> int | None:
    """The node's available memory (Linux ``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits(size: int, local_ranks: int, available: int | None) -> bool:
    """Whether ``COPIES`` copies of ``size`` bytes per rank fit in the node's share."""
    return available is None or COPIES * size * local_ranks <= MEMORY_SHARE * available


def _exchange(
    payload: torch.Tensor, to: int, frm: int, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Send ``payload`` to ``to`` and receive ``frm``'s, sizes first (gloo: CPU tensors)."""
    size_out = torch.tensor([payload.numel()], dtype=torch.int64)
    size_in = torch.zeros(1, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.isend, size_out, to, group),
        dist.P2POp(dist.irecv, size_in, frm, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    received = torch.empty(int(size_in.item()), dtype=torch.uint8)
    ops = [
        dist.P2POp(dist.isend, payload, to, group),
        dist.P2POp(dist.irecv, received, frm, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


# Runs a function on the last async save's staged copy, on the staging thread, once that
# copy is complete (``CheckpointManager.copy_staged``); None when there is none.
FromStaging = Callable[[Callable[[dict[str, Any]], Any]], "Future[Any] | None"]


class MemoryCheckpoint:
    """A Session's side of the copies (one per process group generation: its exchange group
    is one of the generation's). ``prepare`` when the Session starts, ``capture`` at every
    save and memory point, on every rank together; the module's ``promote`` at every step
    boundary."""

    def __init__(self, ranks_per_node: int) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.to, self.frm = peers(self.rank, self.world, ranks_per_node)
        self.local = int(os.environ.get("LOCAL_WORLD_SIZE") or ranks_per_node)
        # The peer copies travel in the background, on a group of their own, beside the
        # training loop's collectives; created with the decision whether the copies fit
        # (``agree``: at a fresh start, or by the first capture after an in-process restart,
        # whose ranks meet a second failure soonest in the Session's start).
        self.group: dist.ProcessGroup | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ddlaunch-memory")
        self.on: bool | None = None  # decided by the first capture, on every rank together
        self.slots = (CpuCopy(), CpuCopy())  # the own copies' buffers (see the module doc)

    def prepare(self, state: Mapping[str, Any]) -> bool:
        """When the Session starts (local, not a collective): allocate and touch the slots,
        one of them the committed copy of a restart when there is one, where the copies fit
        in this node's share of memory (False when not: the first capture then turns the
        copies off on every rank)."""
        plain = plain_state(state)
        if self.on is False or not fits(nbytes(plain), self.local, available_bytes()):
            return False
        mine = held()
        if mine is not None and self.slots[0].copied is None:
            self.slots[0].adopt(mine.own)  # reused if its layout still matches the state's
        for slot in self.slots:
            if slot.copied is None or not _is_committed(slot.copied):
                slot.copy(plain)  # allocates and first-touches (the copy itself is unused)
        return True

    def capture(
        self, step: int, state: Mapping[str, Any], from_staging: FromStaging | None = None
    ) -> bool:
        """This rank's copy of the state as it is now (the loop may go on changing it
        afterwards); the peers' copies on their way. With ``from_staging`` (async saves),
        the copy is made from the save's staged copy on the staging thread, and the loop
        does not wait for it. Returns False on every rank when the copies do not fit."""
        global _previous, _pending
        if not self.agree(state):
            return False
        if _pending is not None:
            # Its copy may be in the slot this capture is about to fill (when it never became
            # complete); normally it arrived long ago. Every rank waits here, so when a rank
            # drops its older complete step below, its peers hold the newer one complete too
            # (or a failure ended the transfer, and the restart falls back to the older).
            with contextlib.suppress(Exception):
                _pending[1].result()
            promote()  # done now: complete, or failed and dropped
        slot = self._free_slot()
        if _previous is not None and _previous.own is slot.copied:
            _previous = None  # its own copy is overwritten next
        copied = from_staging(slot.copy) if from_staging is not None else None
        if copied is None:
            done: Future[dict[str, Any]] = Future()
            done.set_result(slot.copy(plain_state(state)))
            copied = done
        _pending = (step, self.pool.submit(self._send, step, copied))
        return True

    @property
    def pending(self) -> tuple[int, Future[Held]] | None:
        """The step whose copies are on their way, and its transfer."""
        return _pending

    def agree(self, state: Mapping[str, Any]) -> bool:
        """On every rank together, once: whether the copies fit on every node (rank 0 says
        so when not), and the exchange group; False on every rank when not."""
        if self.on is None:
            self.on = self._fits(nbytes(plain_state(state)))
            if self.on and self.to >= 0:
                self.group = dist.new_group(backend="gloo")
            if not self.on:
                self.slots = (CpuCopy(), CpuCopy())  # their buffers freed
        return self.on

    def _free_slot(self) -> CpuCopy:
        """The slot that does not hold the committed copy."""
        return next(slot for slot in self.slots if not _is_committed(slot.copied))

    def _send(self, step: int, copied: Future[dict[str, Any]]) -> Held:
        own = copied.result()  # raises when the staged copy failed: nothing is committed
        if self.to < 0:
            return Held(step, own, -1, None)
        received = _exchange(serialize(own), self.to, self.frm, self.group)
        return Held(step, own, self.frm, received)

    def _fits(self, size: int) -> bool:
        ok = torch.tensor([1 if fits(size, self.local, available_bytes()) else 0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if not ok.item() and self.rank == 0:
            print(
                f"[ddlaunch] memory checkpoint off: {COPIES} copies of {size / 2**20:.0f} MiB "
                f"per rank do not fit in {MEMORY_SHARE:.0%} of the node's available memory; "
                "an in-process restart reads the checkpoint from disk",
                flush=True,
            )
        if not ok.item():
            forget()
        return bool(ok.item())

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _is_committed(copy: dict[str, Any] | None) -> bool:
    return copy is not None and _committed is not None and copy is _committed.own


def restore(state: dict[str, Any], disk_step: int | None) -> int | None:
    """After an in-process restart, on every rank of the new group: the state from RAM when
    the copies allow it (see the module's doc), returning its step; None when they do not
    (every rank then loads from disk). ``disk_step``: the latest complete checkpoint's step,
    as rank 0 found it (the same on every rank)."""
    global _committed, _previous, _pending
    promote(wait=SETTLE_S)  # a transfer on its way at the failure: complete, or ended by it
    _pending = None  # one that is neither holds a group of the old generation: dropped
    mine = kept()
    said = [(h.step, h.peer if h.peer_bytes is not None else -1) for h in mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, said)
    plan = plan_sources([[(int(s), int(p)) for s, p in c] for c in gathered], disk_step)
    if plan is None:
        return None
    step, sources = plan
    rank = dist.get_rank()
    at_step = next((h for h in mine if h.step == step), None)
    ops = []
    incoming: torch.Tensor | None = None
    if rank in sources.values():
        target = next(r for r, holder in sources.items() if holder == rank)
        assert at_step is not None and at_step.peer_bytes is not None
        size = torch.tensor([at_step.peer_bytes.numel()], dtype=torch.int64)
        dist.send(size, target)
        ops.append(dist.P2POp(dist.isend, at_step.peer_bytes, target))
    if rank in sources:
        size_in = torch.zeros(1, dtype=torch.int64)
        dist.recv(size_in, sources[rank])
        incoming = torch.empty(int(size_in.item()), dtype=torch.uint8)
        ops.append(dist.P2POp(dist.irecv, incoming, sources[rank]))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    if incoming is not None:
        plain = deserialize(incoming)
        load_into(state, plain)
        _committed = Held(step, plain, -1, None)  # its peer's copy comes with the next capture
    else:
        assert at_step is not None
        load_into(state, at_step.own)
        _committed = at_step
    _previous = None
    return step


def plan_sources(
    said: list[list[tuple[int, int]]], disk_step: int | None
) -> tuple[int, dict[int, int]] | None:
    """Pure: the step to restore from RAM and who sends each rank that lacks its own copy
    of it its peer copy (``{rank: holder}``), or None when the ranks must read from disk.
    ``said[r]``: the complete copies rank r holds, each (its step, whose peer copy it holds
    for that step, -1 for none); a replacement holds none. The newest step not older than
    the disk's latest that every rank can have wins."""
    steps = sorted(
        {s for held in said for s, _ in held if disk_step is None or s >= disk_step},
        reverse=True,
    )
    for step in steps:
        sources: dict[int, int] = {}
        for rank, held in enumerate(said):
            if any(s == step for s, _ in held):
                continue
            holder = next((h for h, c in enumerate(said) if (step, rank) in c), None)
            if holder is None:
                break
            sources[rank] = holder
        else:
            return step, sources
    return None
