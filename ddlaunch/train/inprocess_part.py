"""The Session's part for ``fault_tolerance.restart: in_process``: what the training loop does
for the in-process restart (``worker.inprocess``, the restart itself).

It owns: the RAM copies of the state (``saving.memory``: taken at each save and at every
``memory_every_steps`` memory point, promoted once complete; off for sharded state); the
restore after an in-process restart (the newest step the ranks' RAM copies allow, else the
latest complete checkpoint on disk) and rank 0's record of that restart in the attempt
(``worker.inprocess.record``); telling the restart loop when each step ends, through the
process's ``Channel`` (how long the first survivor waits for the others).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ddlaunch.config.schema import Config
from ddlaunch.saving import memory
from ddlaunch.saving.manager import CheckpointManager
from ddlaunch.train.parts import Restored, SessionPart
from ddlaunch.worker import inprocess


class InProcessPart(SessionPart):
    """The in-process restart's part of a Session (see the module's doc). ``channel``: the
    one the restart loop holds (``worker.inprocess.channel()``)."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        *,
        rank: int,
        state: dict[str, Any],
        manager: CheckpointManager,
        channel: inprocess.Channel,
    ) -> None:
        ft = config.fault_tolerance
        self._run_dir = run_dir
        self._rank = rank
        self._state = state
        self._manager = manager
        self._channel = channel
        self._memory_every = ft.memory_every_steps
        # The last committed checkpoint is also kept in RAM, and a restart in this process
        # restores from it.
        self.memory = ft.memory_checkpoint == "auto"
        if self.memory and memory.sharded(state):
            self.memory = False
            if rank == 0:
                print(
                    "[ddlaunch] memory checkpoint off: the state holds sharded (DTensor) "
                    "tensors; an in-process restart reads the checkpoint from disk",
                    flush=True,
                )
        self._copies: memory.MemoryCheckpoint | None = None
        self.state_from: str | None = None  # after an in-process restart: "ram" or "disk"

    # ---------------------------------------------------------------- start

    def restore(self) -> Restored | None:
        """After an in-process restart: the newest step the ranks' RAM copies allow (every
        rank together; it may be newer than the disk's latest checkpoint, from a memory
        point), else the latest complete checkpoint from disk; rank 0 records the restart in
        the attempt. None on the process's first start."""
        generation = self._channel.generation
        if generation.number == 0:
            return None
        manager, state = self._manager, self._state
        disk = manager.latest_complete()
        step = memory.restore(state, disk.step if disk else None) if self.memory else None
        if step is not None:
            if disk is not None:  # the checkpoint the next save follows, as after a load
                manager.adopt(disk, state)
            else:
                manager.prepare_staging(state)
            self.state_from = memory.STATE_FROM_RAM
        else:
            info = manager.load_latest(state)
            step = info.step if info else None
            self.state_from = memory.STATE_FROM_DISK
        if self._rank == 0 and generation.plan is not None:
            inprocess.record(
                self._run_dir,
                generation.plan,
                rank_pids=generation.rank_pids,
                resumed_from=step,
                state_from=self.state_from,
                formed=generation.formed,
            )
        return Restored(step, self.state_from)

    def started(self, start_step: int, restored: Restored | None) -> None:
        if not self.memory:
            return
        # The RAM copies' buffers now, not at a save.
        self._copies = memory.MemoryCheckpoint(_ranks_per_node())
        self._copies.prepare(self._state)  # local
        if self.state_from is None:  # a fresh start, not an in-process restart
            self.memory = self._copies.agree(self._state)  # every rank together

    def where(self, said: str) -> str:
        return said + " (state from RAM)" if self.state_from == memory.STATE_FROM_RAM else said

    # ---------------------------------------------------------------- steps

    def on_boundary(self, step: int) -> None:
        self._channel.step_done()
        if self._copies is not None:
            memory.promote()  # local, never waits

    def on_save(self, step: int) -> None:
        self._keep(step, saved=True)

    def between_saves(self, step: int) -> None:
        if (
            self.memory
            and memory.memory_point(step, self._memory_every)
            and self._manager.everywhere(memory.settled())
        ):
            self._keep(step, saved=False)

    def _keep(self, step: int, saved: bool) -> None:
        """At a save (``saved``) or a memory point: the RAM copies of this step (every rank
        together); a restart may use them once they are complete (``on_boundary``)."""
        if self.memory:
            if self._copies is None:
                self._copies = memory.MemoryCheckpoint(_ranks_per_node())
            # Async saves: copied from the save's staged copy, off the loop's thread.
            staged = self._manager.copy_staged if saved else None
            self.memory = self._copies.capture(step, self._state, staged)

    # ---------------------------------------------------------------- end

    def close(self, final_step: int | None) -> None:
        if self._copies is not None:
            self._copies.close()


def _ranks_per_node() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE") or dist.get_world_size())
