"""The Session's part for ``fault_tolerance.mode: replica_groups``: one replica group of the
job, run through torchft's Manager (``worker.replica``).

It owns: the ``Replica`` of this rank's group and the Manager's step in every checkpoint
(``_ManagerState``, restored with the model on a whole-job start); the start (the latest
complete checkpoint on a whole-job start, nothing from disk on a group restart: the first
quorum heals it from a live peer); the steps, which follow the Manager's committed step (a
healed group jumps to its peer's, a step broken by a dying peer group is run again); who
saves (rank 0 of the current quorum: one group writes the job's checkpoints and progress);
the stop agreement across the groups; the divergence check; the optimizer that steps only
when a step commits, the gradients averaged across the live groups, torchft's DDP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful

from ddlaunch.config.schema import Config
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.saving.manager import CheckpointManager
from ddlaunch.train.parts import Restored, SessionPart
from ddlaunch.worker.replica import Replica, ReplicaOptimizer

# The Manager's entry in the Session's state (and so in every checkpoint): torchft's rule,
# the committed step is saved with the model.
MANAGER_KEY = "torchft"


class ReplicaPart(SessionPart):
    """One replica group's part of a Session (see the module's doc)."""

    def __init__(
        self,
        identity: GroupIdentity,
        config: Config,
        run_dir: Path,
        *,
        rank: int,
        state: dict[str, Any],
        manager: CheckpointManager,
        model: torch.nn.Module,
        check_every: int,
    ) -> None:
        self.identity = identity
        self._rank = rank  # in the group's process group
        self._state = state
        self._manager = manager
        self._model = model
        self._every_steps = config.fault_tolerance.checkpoint_every_steps
        self._optimizer: ReplicaOptimizer | None = None
        # The Session's state, as a healing group receives it.
        self.replica = Replica(
            identity,
            config,
            run_dir,
            state_dict=self._user_state,
            load_state_dict=self._load_user_state,
            check_every=check_every,
        )
        state[MANAGER_KEY] = _ManagerState(self.replica.manager)

    def _user_state(self) -> dict[str, Any]:
        return {
            key: value.state_dict() if isinstance(value, Stateful) else value
            for key, value in self._state.items()
            if key != MANAGER_KEY
        }

    def _load_user_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            target = self._state.get(key)
            if isinstance(target, Stateful):
                target.load_state_dict(value)
            elif isinstance(target, torch.Tensor):
                target.copy_(value)
            else:
                self._state[key] = value

    # ---------------------------------------------------------------- start

    def job_place(self, rank: int, world: int) -> tuple[int, int]:
        return self.replica.job_rank, self.identity.groups * world

    def restore(self) -> Restored:
        if self.identity.restart == 0:
            info = self._manager.load_latest(self._state)
            return Restored(info.step if info else None)
        self._manager.prepare_staging(self._state)
        return Restored(None)

    def where(self, said: str) -> str:
        if self.identity.restart:
            return "a live peer group's state (the group restarted)"
        return said

    # ---------------------------------------------------------------- steps

    def steps(
        self,
        total: int,
        boundary: Callable[[int, int], None],
        started_at: Callable[[int], None],
    ) -> Iterator[int]:
        return self._steps(total, boundary, started_at)

    def _steps(
        self,
        total: int,
        boundary: Callable[[int, int], None],
        started_at: Callable[[int], None],
    ) -> Iterator[int]:
        """The steps follow the manager's committed step: a healed group jumps to its
        peer's; a step that did not commit (a peer group died in it) is run again."""
        replica = self.replica
        first = True
        while replica.step < total:
            step = replica.start_step()
            if first and replica.healed is not None and replica.identity.restart:
                # A restarted group took a peer's state at its first quorum: it starts from
                # that step, not from 0 (what ``start_step`` says from the first step on). A
                # whole-job start keeps the checkpoint's step even when a group catches up
                # with an earlier one at its first quorum: the attempt resumed from it.
                started_at(replica.healed.healed_from_step)
            first = False
            if step >= total:
                break
            yield step
            if not replica.commit():
                if self._rank == 0:
                    print(
                        f"[ddlaunch] step {step} did not commit (a peer group failed in it); "
                        "running it again",
                        flush=True,
                    )
                continue
            boundary(replica.step, total)

    def saves(self) -> bool:
        return self.replica.is_saver()

    def on_boundary(self, step: int) -> None:
        self.replica.write_step(step)

    def agree_stop(self, stop: bool) -> bool:
        return self.replica.agree_stop(stop)

    def after_step(self, step: int, total: int) -> None:
        if self._check_due(step, total):
            self.replica.check_in_sync(self._model, step)

    def _check_due(self, step: int, total: int) -> bool:
        """The divergence check's steps: the same on every group (step numbers only, no
        clocks): every ``check_every`` steps, each step-cadence checkpoint, the last step."""
        every = self._every_steps
        cadence = bool(every) and step % (every or 1) == 0
        return step >= total or step % self.replica.check_every == 0 or cadence

    # ---------------------------------------------------------------- training calls

    def optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """A wrapper that applies a step only when it commits (``ReplicaOptimizer``)."""
        if self._optimizer is None:
            self._optimizer = ReplicaOptimizer(self.replica, optimizer)
        return self._optimizer

    def average_gradients(self, model: torch.nn.Module) -> bool:
        self.replica.average(model)
        return True

    def wrap_ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.replica.group_world != 1:
            raise ValueError(
                "wrap_ddp in replica groups averages across groups only: with more than one "
                "rank per group call session.average_gradients(model) after backward instead"
            )
        from torchft.ddp import DistributedDataParallel

        wrapped: torch.nn.Module = DistributedDataParallel(self.replica.manager, model)
        return wrapped

    # ---------------------------------------------------------------- end

    def close(self, final_step: int | None) -> None:
        if final_step is not None:
            self.replica.write_step(final_step, force=True)
        self.replica.shutdown()


class _ManagerState(Stateful):
    """The torchft Manager's step in a checkpoint (restored with the model on a whole-job
    start, so every group's manager resumes at the checkpoint's step)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def state_dict(self) -> dict[str, Any]:
        return dict(self.manager.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.manager.load_state_dict(state_dict)
