"""The in-job API for training loops: restore, checkpoint, stop on the signal, requeue.

    from ddlaunch.train import Session

    def main(config):
        model, optimizer = build()
        with Session(config, model, optimizer) as session:   # restores the latest checkpoint
            for step in session.steps(total_steps):           # starts at the restored step
                train_one_step(step)                          # data chosen by `step`
        # leaving the block commits the final checkpoint

At every step boundary the session (a) commits a finished background save, (b) agrees
across ranks whether the pre-timeout signal arrived (a collective, so every rank takes the
same branch), (c) saves on the configured cadence. On the signal, *all* ranks save step N
synchronously, rank 0 commits, records the attempt and requeues the job; every rank then
leaves with ``Preempted`` (a clean exit). The next attempt resumes at step N.

``device_mesh()`` (or ``Session.mesh``) is the ``DeviceMesh`` of the config's ``parallel:``
plan; DTensor state (FSDP2, tensor parallel) is checkpointed through DCP like any other, and a
resume on another plan reshards it (``ddlaunch/examples/transformer.py``).

A save that fails (a full disk) fails on every rank together (``CheckpointSaveError``) and
is never committed; the previous complete checkpoint stays. With
``fault_tolerance.on_save_failure: stop`` rank 0 ends the run with the reason (``checkpoint
save failed: no space left on <dir>``, through ``ddlaunch.conclude``) before any rank exits;
with ``continue`` training goes on and the next save tries again.

With ``fault_tolerance.mode: replica_groups`` (each replica group its own world, restarted
alone) the session also runs torchft's per-step quorum (``ddlaunch.worker.replica``): the
steps follow the committed step, a healed group jumps to its peer's, a step broken by a dying
peer group is run again (``session.start_step`` of a restarted group is the step it healed
to, once its first step is yielded). The loop steps ``session.optimizer`` and calls
``session.average_gradients(model)`` (both do what the plain calls did in job mode), and
picks its data by ``session.job_rank``; a loop that averages within its group only is
stopped with ``ReplicaGroupsDiverged``. One group saves the checkpoints.

``session.batch_share()`` is the number of samples this rank computes in the current step
(``session.batch_offset()``: where they start in the step's global batch of
``balance.global_batch``). With ``balance: by_throughput`` over train components of unlike
speed, the shares follow each component's measured compute throughput after
``balance.measure_steps`` steps (``ddlaunch.worker.balance``); ``average_gradients`` and
``wrap_ddp`` then weight each rank's gradient by its share, so the step's gradient is the
mean over the global batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh

from ddlaunch.checkpoint.layout import CheckpointInfo
from ddlaunch.conclude import conclude
from ddlaunch.config.schema import Config
from ddlaunch.planning.container import CONCLUDE_ON_HOST_VAR
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.policy.requeue import CAUSE_CHECKPOINT, CAUSE_SIGNAL, Ending, RetryBudget
from ddlaunch.saving import memory
from ddlaunch.saving.manager import CheckpointManager, CheckpointSaveError, TrainState
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, signal_save, timings
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.progress import write_progress
from ddlaunch.store.rundir import CHECKPOINTS_DIR
from ddlaunch.worker import inprocess, signals
from ddlaunch.worker.balance import Balancer
from ddlaunch.worker.distributed import init_distributed
from ddlaunch.worker.heartbeat import Heartbeat
from ddlaunch.worker.mesh import device_mesh
from ddlaunch.worker.replica import (
    CHECK_EVERY,
    Replica,
    ReplicaGroupsDiverged,
    ReplicaOptimizer,
    group_identity,
)

__all__ = ["Preempted", "ReplicaGroupsDiverged", "Session", "device_mesh"]
from ddlaunch.worker.stops import StopRank

PROGRESS_EVERY_S = 5.0


class Preempted(StopRank):
    """Raised on every rank after the signal-triggered save; exits the rank with code 0. Our
    own control flow: the rank function writes no failure record for it."""

    def __init__(self, step: int) -> None:
        super().__init__(0, f"stopped after saving step {step}")
        self.step = step


class Session:
    def __init__(
        self,
        config: Config,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        extra_state: dict[str, Any] | None = None,
        check_every: int = CHECK_EVERY,
    ) -> None:
        init_distributed()
        self.config = config
        self.rank = dist.get_rank()
        # The job-wide rank and world: the group-local ones, except in replica groups.
        self.job_rank, self.job_world = self.rank, dist.get_world_size()
        self.run_dir = Path(os.environ.get("DDLAUNCH_RUN_DIR", "."))
        self.attempt = AttemptId.from_env(os.environ)
        root = os.environ.get("DDLAUNCH_CHECKPOINT_DIR") or str(self.run_dir / CHECKPOINTS_DIR)
        ft = config.fault_tolerance
        self.manager = CheckpointManager(
            root,
            keep_last=ft.keep_last,
            async_save=ft.async_save,
            overlap_staging=ft.overlap_staging,
        )
        self.state: dict[str, Any] = {
            "train": TrainState(model, optimizer or ()),
            **(extra_state or {}),
        }
        self._model = model
        self._optimizer = optimizer
        self.replica: Replica | None = None
        identity = group_identity(config, os.environ)
        # fault_tolerance.restart: in_process: the last committed checkpoint is also kept in
        # RAM (saving.memory), and a restart in this process restores from it.
        self._in_process = ft.restart == "in_process" and identity is None
        self._memory = self._in_process and ft.memory_checkpoint == "auto"
        if self._memory and memory.sharded(self.state):
            self._memory = False
            if self.rank == 0:
                print(
                    "[ddlaunch] memory checkpoint off: the state holds sharded (DTensor) "
                    "tensors; an in-process restart reads the checkpoint from disk",
                    flush=True,
                )
        self.state_from: str | None = None  # after an in-process restart: "ram" or "disk"
        self._copies: memory.MemoryCheckpoint | None = None
        if identity is not None:
            info = self._join_groups(identity, check_every)
            start = info.step if info else None
        elif self._in_process and inprocess.current().number > 0:
            start = self._restore_in_process()
        else:
            info = self.manager.load_latest(self.state)
            start = info.step if info else None
        if self._memory:  # the RAM copies' buffers now, not at a save
            self._copies = memory.MemoryCheckpoint(_ranks_per_node())
            self._copies.prepare(self.state)  # local
            if self.state_from is None:  # a fresh start, not an in-process restart
                self._memory = self._copies.agree(self.state)  # every rank together
        self.start_step = start if start is not None else 0
        self.resumed = start is not None
        # balance: each rank's share of the global batch (by_throughput: measured, then
        # balanced over the train components; ``batch_share``).
        self._balance = Balancer(
            config.balance,
            rank=self.job_rank,
            world=self.job_world,
            run_dir=self.run_dir,
            attempt=self.attempt.key,
            start_step=self.start_step,
        )
        self._last_progress = 0.0
        self._final_step: int | None = None
        self._first_step_seen = False
        self._staging_seen = 0.0  # the manager's staging waits already counted in a save
        # Step, time and step duration for the watchdog and `status`: in memory per step, a
        # background thread writes one small file per rank every health.heartbeat_interval.
        self.heartbeat = Heartbeat.for_attempt(
            self.run_dir, self.job_rank, config.health.heartbeat_interval, self.attempt
        ).start()
        if self.rank == 0:
            where = f"step {self.start_step}" if self.resumed else "scratch"
            if self.replica is not None and self.replica.identity.restart:
                where = "a live peer group's state (the group restarted)"
            if self.state_from == memory.STATE_FROM_RAM:
                where += " (state from RAM)"
            print(f"[ddlaunch] starting from {where}", flush=True)

    def _restore_in_process(self) -> int | None:
        """After an in-process restart: the newest step the ranks' RAM copies allow (every
        rank together; it may be newer than the disk's latest checkpoint, from a memory
        point), else the latest complete checkpoint from disk; rank 0 records the restart in
        the attempt. Returns the step resumed from (None: from scratch)."""
        generation = inprocess.current()
        disk = self.manager.latest_complete()
        step = memory.restore(self.state, disk.step if disk else None) if self._memory else None
        if step is not None:
            if disk is not None:  # the checkpoint the next save follows, as after a load
                self.manager.adopt(disk, self.state)
            else:
                self.manager.prepare_staging(self.state)
            self.state_from = memory.STATE_FROM_RAM
        else:
            info = self.manager.load_latest(self.state)
            step = info.step if info else None
            self.state_from = memory.STATE_FROM_DISK
        if self.rank == 0 and generation.plan is not None:
            inprocess.record(
                self.run_dir,
                generation.plan,
                resumed_from=step,
                state_from=self.state_from,
                formed=generation.formed,
            )
        return step

    def _keep_in_memory(self, step: int, saved: bool = True) -> None:
        """At a save (``saved``) or a memory point: the RAM copies of this step (every rank
        together); a restart may use them once they are complete (``_promote_copies``)."""
        if self._memory:
            if self._copies is None:
                self._copies = memory.MemoryCheckpoint(_ranks_per_node())
            # Async saves: copied from the save's staged copy, off the loop's thread.
            staged = self.manager.copy_staged if saved else None
            self._memory = self._copies.capture(step, self.state, staged)

    def _promote_copies(self) -> None:
        if self._copies is not None:
            memory.promote()  # local, never waits

    def _join_groups(self, identity: GroupIdentity, check_every: int) -> CheckpointInfo | None:
        """Replica groups: the torchft Manager, with the Session's state as what a healing
        group receives; the latest complete checkpoint on a whole-job start, nothing from
        disk on a group restart (the first quorum heals it from a live peer)."""
        replica = Replica(
            identity,
            self.config,
            self.run_dir,
            state_dict=self._user_state,
            load_state_dict=self._load_user_state,
            check_every=check_every,
        )
        self.replica = replica
        self.job_rank = replica.job_rank
        self.job_world = identity.groups * dist.get_world_size()
        # Saved with every checkpoint: the manager's committed step (torchft's rule).
        self.state[_MANAGER_KEY] = _ManagerState(replica.manager)
        if identity.restart == 0:
            return self.manager.load_latest(self.state)
        self.manager.prepare_staging(self.state)
        return None

    def _user_state(self) -> dict[str, Any]:
        return {
            key: value.state_dict() if isinstance(value, Stateful) else value
            for key, value in self.state.items()
            if key != _MANAGER_KEY
        }

    def _load_user_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            target = self.state.get(key)
            if isinstance(target, Stateful):
                target.load_state_dict(value)
            elif isinstance(target, torch.Tensor):
                target.copy_(value)
            else:
                self.state[key] = value

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer the loop steps: the Session's own in job mode; in replica groups a
        wrapper that applies a step only when it commits (``ReplicaOptimizer``)."""
        if self.replica is None or self._optimizer is None:
            return self._optimizer
        if not isinstance(self._optimizer, ReplicaOptimizer):
            self._optimizer = ReplicaOptimizer(self.replica, self._optimizer)
        return self._optimizer

    def average_gradients(self, model: torch.nn.Module) -> None:
        """Average the gradients of ``model`` over every data-parallel rank: an all-reduce
        over the world in job mode; in replica groups within the group, then across the
        live groups (through the torchft Manager). A fixed order, no buckets: the first
        step after a resume sums exactly as an uninterrupted run does."""
        if self.replica is not None:
            self.replica.average(model)
            return
        if self._balance.weighted:
            # Unequal shares: each rank's mean gradient weighted by share / global_batch
            # and summed, the mean over the global batch (``worker.balance``).
            self._balance.average(model)
            return
        world = dist.get_world_size()
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad /= world

    def wrap_ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        """A DistributedDataParallel of ``model`` for this mode: torch's over the world in
        job mode; torchft's (gradients averaged across the live groups) in replica groups,
        for one-rank groups; use ``average_gradients`` for larger groups."""
        if self.replica is None:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            if self._balance.weighted:  # unequal shares: weighted by share, summed
                self._balance.register(ddp)
            return ddp
        if self.replica.group_world != 1:
            raise ValueError(
                "wrap_ddp in replica groups averages across groups only: with more than one "
                "rank per group call session.average_gradients(model) after backward instead"
            )
        from torchft.ddp import DistributedDataParallel

        return DistributedDataParallel(self.replica.manager, model)

    def batch_share(self) -> int:
        """Samples this rank computes in the current step (its loss is their mean). With
        ``balance: by_throughput``: equal shares while the components' speed is measured,
        then shares proportional to it; they sum to ``balance.global_batch``. With ``balance:
        none``: ``global_batch // world``. Also ``$DDLAUNCH_BATCH_SHARE``, set when it changes.
        ValueError without ``balance.global_batch``."""
        return self._balance.share()

    def batch_offset(self) -> int:
        """Where this rank's samples start in the step's global batch: the shares of the
        ranks before it (its samples are ``offset .. offset + batch_share()``)."""
        return self._balance.offset()

    @property
    def mesh(self) -> DeviceMesh:
        """The job's device mesh (``device_mesh(config)``): dims pp, dp_replicate, dp_shard,
        cp, tp, outermost first."""
        return device_mesh(self.config)

    # ------------------------------------------------------------------ loop

    def steps(self, total: int) -> Iterator[int]:
        """Yield the global steps still to run; checkpoint and stop at step boundaries."""
        if self.replica is not None:
            return self._replica_steps(self.replica, total)
        return self._job_steps(total)

    def _job_steps(self, total: int) -> Iterator[int]:
        step = self.start_step
        while step < total:
            self._balance.begin(step)
            yield step
            self._balance.end(step)
            step += 1
            self._boundary(step, total)
        self._final_step = total  # leaving the ``with`` block saves it

    def _replica_steps(self, replica: Replica, total: int) -> Iterator[int]:
        """The steps follow the manager's committed step: a healed group jumps to its
        peer's; a step that did not commit (a peer group died in it) is run again."""
        first = True
        while replica.step < total:
            step = replica.start_step()
            if first and replica.healed is not None and replica.identity.restart:
                # A restarted group took a peer's state at its first quorum: it starts from
                # that step, not from 0 (what ``start_step`` says from the first step on). A
                # whole-job start keeps the checkpoint's step even when a group catches up
                # with an earlier one at its first quorum: the attempt resumed from it.
                self.start_step = replica.healed.healed_from_step
            first = False
            if step >= total:
                break
            yield step
            if not replica.commit():
                if self.rank == 0:
                    print(
                        f"[ddlaunch] step {step} did not commit (a peer group failed in it); "
                        "running it again",
                        flush=True,
                    )
                continue
            self._boundary(replica.step, total)
        self._final_step = total

    def _boundary(self, step: int, total: int) -> None:
        ft = self.config.fault_tolerance
        if self._in_process:
            inprocess.step_done()
        replica = self.replica
        # In replica groups one group writes the job's checkpoints and progress: rank 0 of
        # the current quorum (the same on every rank of a group).
        saver = replica is None or replica.is_saver()
        self._saving(self.manager.maybe_finish)
        self._promote_copies()
        if saver:
            self._report(step)
        if replica is not None:
            replica.write_step(step)
        waited = time.monotonic()
        stop = signals.agreed()
        if replica is not None:
            stop = replica.agree_stop(stop)
        # The agreement is a collective: time spent in it is time waiting for slower ranks.
        self.heartbeat.step(step, wait_s=time.monotonic() - waited)
        if stop:
            if not saver:  # another group saves; this one just leaves
                self.heartbeat.stop("preempted")
                raise Preempted(step)
            self._save_and_requeue(step)
        if replica is not None and _check_due(replica, step, total, ft.checkpoint_every_steps):
            replica.check_in_sync(self._model, step)
        if not saver:
            return
        if not self._first_step_seen and self.rank == 0:
            # Where this attempt's restart cost ends (``ddlaunch advise``).
            self._first_step_seen = True
            a = self.attempt
            timings.append(
                self.run_dir,
                timings.FIRST_STEP,
                step=step,
                time=time.time(),
                attempt=a.key,
            )
        if step < total and self.manager.should_save(
            step, every_steps=ft.checkpoint_every_steps, every_minutes=ft.checkpoint_every_minutes
        ):
            self._saving(lambda: self._timed_save(step))
        elif (
            step < total
            and self._memory
            and memory.memory_point(step, ft.memory_every_steps)
            and self.manager.everywhere(memory.settled())
        ):
            self._keep_in_memory(step, saved=False)

    def _timed_save(self, step: int) -> None:
        """Save, and (rank 0) record what it cost the training loop: the blocking part, and
        the waits of the steps since the previous save for that one's background copy."""
        waited = self.manager.staging_wait_s - self._staging_seen
        start, begun = time.time(), time.perf_counter()
        self.manager.save(step, self.state, {"step": step})
        self._keep_in_memory(step)
        blocking = time.perf_counter() - begun
        self._staging_seen = self.manager.staging_wait_s
        if self.rank == 0:
            timings.append(
                self.run_dir,
                timings.SAVE,
                step=step,
                time=start,
                blocking_s=round(blocking, 4),
                stall_s=round(blocking + waited, 4),
                async_save=self.manager.async_save,
                attempt=self.attempt.key,
            )

    def _note_save(self, step: int, reason: str) -> None:
        """Rank 0: when a save that is no periodic one began (``report`` draws every save;
        ``advise`` measures the periodic ones only)."""
        if self.rank == 0:
            timings.append(
                self.run_dir,
                timings.SAVE,
                step=step,
                time=time.time(),
                reason=reason,
                attempt=self.attempt.key,
            )

    def _saving(self, save: Any, final: bool = False) -> Any:
        """Run a save (or the commit of one); a failure, which every rank sees together,
        stops the run or (on_save_failure: continue) is recorded and training goes on."""
        try:
            return save()
        except CheckpointSaveError as exc:
            if final or self.config.fault_tolerance.on_save_failure == "stop":
                self._stop_on(exc)
            if self.rank == 0:
                print(f"[ddlaunch] {exc.reason}; training continues", flush=True)
                entry = {"step": exc.step, "reason": exc.reason, "time": time.time()}
                failed = attempts.load(self.run_dir)[-1:]
                before = (failed[0].checkpoint_errors if failed else None) or ()
                errors = [*before[-9:], entry]
                attempts.update_open(self.run_dir, checkpoint_errors=errors)
            return None

    def _stop_on(self, exc: CheckpointSaveError) -> None:
        """Rank 0 records why the run stops before any rank leaves: the first rank to exit
        nonzero makes srun (--kill-on-bad-exit) end the others, rank 0 included."""
        if self.rank == 0:
            print(f"[ddlaunch] {exc.reason}: the run stops", flush=True)
            if self.attempt.job_id:
                last = self.manager.last_committed
                ending = Ending(
                    CAUSE_CHECKPOINT,
                    last.step if last else None,
                    record={"checkpoint": str(exc)},
                    final=exc.reason,
                )
                budget = RetryBudget(self.config.fault_tolerance.max_requeues)
                conclude(self.run_dir, ending, budget, SlurmClient(), job=self.attempt.task)
        dist.barrier()
        self.heartbeat.stop("failed")
        raise exc

    def _report(self, step: int, force: bool = False) -> None:
        # Rank 0 only, a few times a minute: cheap enough never to slow a step.
        now = time.time()
        if self.rank != 0 or (not force and now - self._last_progress < PROGRESS_EVERY_S):
            return
        self._last_progress = now
        write_progress(self.run_dir, step, self.attempt.job_id or None)

    def _save_and_requeue(self, step: int) -> None:
        self._saving(self.manager.wait)
        meta = {"step": step, "reason": "signal"}
        self._note_save(step, "signal")
        info = self._saving(lambda: self.manager.save(step, self.state, meta), final=True)
        if info is None:  # async mode: save() only staged it
            self._saving(self.manager.wait, final=True)
        dist.barrier()
        if self.rank == 0:
            self._report(step, force=True)
            if self.attempt.job_id:  # a local run has no attempt to conclude
                self._conclude(step)
        self.heartbeat.stop("preempted")
        raise Preempted(step)

    def _conclude(self, step: int) -> None:
        """Rank 0, after the signal save: conclude the attempt here (requeue, or record why
        not). On preemption the batch shell may never reach the end hook."""
        reason = signals.reason() or "signal"
        print(f"[ddlaunch] saved step {step} on {reason}", flush=True)
        if os.environ.get(CONCLUDE_ON_HOST_VAR):
            # In a container: no scontrol here. The end hook on the host concludes when srun
            # returns (these ranks now leave with exit code 0).
            signal_save.write(self.run_dir, self.attempt, step, reason)
            return
        ending = Ending(CAUSE_SIGNAL, step, record={"signal": reason}, saved_step=step)
        budget = RetryBudget(self.config.fault_tolerance.max_requeues)
        conclude(self.run_dir, ending, budget, SlurmClient(), job=self.attempt.task)

    # ------------------------------------------------------------------ end

    def close(self, final_step: int | None = None) -> None:
        """Commit what is pending and save ``final_step`` if it is not committed yet."""
        self._saving(self.manager.wait)
        last = self.manager.last_committed
        saver = self.replica is None or self.replica.is_saver()
        if saver and final_step is not None and (last is None or last.step != final_step):
            meta = {"step": final_step, "final": True}
            self._note_save(final_step, "final")
            self._saving(lambda: self.manager.save(final_step, self.state, meta), final=True)
            self._saving(self.manager.wait, final=True)
        self.manager.close()
        if self._copies is not None:
            self._copies.close()
        if saver:
            self._report(final_step if final_step is not None else self.start_step, force=True)
        if self.replica is not None:
            if final_step is not None:
                self.replica.write_step(final_step, force=True)
            self.replica.shutdown()
        self.heartbeat.stop("closed")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close(self._final_step)
        elif not issubclass(exc_type, Preempted):
            self.heartbeat.stop("failed")


_MANAGER_KEY = "torchft"


class _ManagerState(Stateful):
    """The torchft Manager's step in a checkpoint (restored with the model on a whole-job
    start, so every group's manager resumes at the checkpoint's step)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def state_dict(self) -> dict[str, Any]:
        return dict(self.manager.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.manager.load_state_dict(state_dict)


def _ranks_per_node() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE") or dist.get_world_size())


def _check_due(replica: Replica, step: int, total: int, every_steps: int | None) -> bool:
    """The divergence check's steps: the same on every group (step numbers only, no
    clocks): every ``check_every`` steps, each step-cadence checkpoint, the last step."""
    cadence = bool(every_steps) and step % (every_steps or 1) == 0
    return step >= total or step % replica.check_every == 0 or cadence
