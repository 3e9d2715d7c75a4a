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

The package: this module's ``Session`` (the story, told in its docstring), ``parts`` (the
hooks of an optional part), ``replica_part`` (replica groups) and ``inprocess_part`` (the
in-process restart).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ddlaunch.conclude import conclude
from ddlaunch.config.schema import Config
from ddlaunch.planning.container import CONCLUDE_ON_HOST_VAR
from ddlaunch.policy.requeue import CAUSE_CHECKPOINT, CAUSE_SIGNAL, Ending, RetryBudget
from ddlaunch.saving.manager import CheckpointManager, CheckpointSaveError, TrainState
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, signal_save, timings
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.progress import write_progress
from ddlaunch.store.rundir import CHECKPOINTS_DIR
from ddlaunch.train.inprocess_part import InProcessPart
from ddlaunch.train.parts import Restored, SessionPart
from ddlaunch.train.replica_part import ReplicaPart
from ddlaunch.worker import inprocess, signals
from ddlaunch.worker.balance import Balancer
from ddlaunch.worker.distributed import init_distributed
from ddlaunch.worker.heartbeat import Heartbeat
from ddlaunch.worker.mesh import device_mesh
from ddlaunch.worker.replica import CHECK_EVERY, Replica, ReplicaGroupsDiverged, group_identity
from ddlaunch.worker.stops import StopRank

__all__ = ["Preempted", "ReplicaGroupsDiverged", "Session", "device_mesh"]

PROGRESS_EVERY_S = 5.0


class Preempted(StopRank):
    """Raised on every rank after the signal-triggered save; exits the rank with code 0. Our
    own control flow: the rank function writes no failure record for it."""

    def __init__(self, step: int) -> None:
        super().__init__(0, f"stopped after saving step {step}")
        self.step = step


class Session:
    """One rank's training session, from its start to its last checkpoint.

    The story: the Session joins the process group and restores the state (``model``,
    ``optimizer``, ``extra_state``) from the latest complete checkpoint, so that
    ``start_step`` is where this attempt begins (``resumed``: whether a checkpoint was
    found). The loop runs ``steps(total)``; at each step boundary the Session commits a
    finished background save, writes the progress and the heartbeat, agrees with every rank
    whether the pre-timeout signal came (then every rank saves, rank 0 concludes the
    attempt and requeues, and every rank leaves with ``Preempted``), and saves on the
    configured cadence; a failed save stops the run or is recorded (``on_save_failure``).
    Leaving the ``with`` block commits the final checkpoint.

    What ``fault_tolerance`` adds to that story is held in parts (``train.parts``), each
    called at the same points: ``replica_part`` for ``mode: replica_groups`` (the steps
    follow torchft's committed step; one group saves; the optimizer, the gradients and DDP
    go through the Manager) and ``inprocess_part`` for ``restart: in_process`` (the state
    kept in RAM; after a restart in this process, restored from it). ``balance`` (each
    rank's share of the global batch) is the Session's own.
    """

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
        self._parts = self._make_parts(model, check_every)
        # The job-wide rank and world: the group-local ones, except in replica groups.
        self.job_rank, self.job_world = self.rank, dist.get_world_size()
        for part in self._parts:
            self.job_rank, self.job_world = part.job_place(self.job_rank, self.job_world)
        restored = self._restore()
        # After an in-process restart: where the state came from ("ram" or "disk").
        self.state_from = restored.state_from if restored else None
        start = restored.step if restored else self._load_latest()
        self.start_step = start if start is not None else 0
        self.resumed = start is not None
        for part in self._parts:
            part.started(self.start_step, restored)
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
            for part in self._parts:
                where = part.where(where)
            print(f"[ddlaunch] starting from {where}", flush=True)

    def _make_parts(self, model: torch.nn.Module, check_every: int) -> list[SessionPart]:
        """The parts ``fault_tolerance`` asks for: replica groups (in their group's
        environment), else the in-process restart, else none."""
        identity = group_identity(self.config, os.environ)
        if identity is not None:
            replica = ReplicaPart(
                identity,
                self.config,
                self.run_dir,
                rank=self.rank,
                state=self.state,
                manager=self.manager,
                model=model,
                check_every=check_every,
            )
            return [replica]
        if self.config.fault_tolerance.restart == "in_process":
            part = InProcessPart(
                self.config,
                self.run_dir,
                rank=self.rank,
                state=self.state,
                manager=self.manager,
                channel=inprocess.channel(),
            )
            return [part]
        return []

    def _restore(self) -> Restored | None:
        for part in self._parts:
            restored = part.restore()
            if restored is not None:
                return restored
        return None

    def _load_latest(self) -> int | None:
        info = self.manager.load_latest(self.state)
        return info.step if info else None

    @property
    def replica(self) -> Replica | None:
        """This rank's replica group (``fault_tolerance.mode: replica_groups``), else None."""
        return next((p.replica for p in self._parts if isinstance(p, ReplicaPart)), None)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer the loop steps: the Session's own in job mode; in replica groups a
        wrapper that applies a step only when it commits (``ReplicaOptimizer``)."""
        optimizer = self._optimizer
        if optimizer is None:
            return None
        for part in self._parts:
            optimizer = part.optimizer(optimizer)
        return optimizer

    def average_gradients(self, model: torch.nn.Module) -> None:
        """Average the gradients of ``model`` over every data-parallel rank: an all-reduce
        over the world in job mode; in replica groups within the group, then across the
        live groups (through the torchft Manager). A fixed order, no buckets: the first
        step after a resume sums exactly as an uninterrupted run does."""
        if any(part.average_gradients(model) for part in self._parts):
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
        for part in self._parts:
            wrapped = part.wrap_ddp(model)
            if wrapped is not None:
                return wrapped
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if self._balance.weighted:  # unequal shares: weighted by share, summed
            self._balance.register(ddp)
        return ddp

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
        for part in self._parts:
            driven = part.steps(total, self._boundary, self._started_at)
            if driven is not None:
                return self._until_closed(driven, total)
        return self._job_steps(total)

    def _started_at(self, step: int) -> None:
        self.start_step = step

    def _until_closed(self, steps: Iterator[int], total: int) -> Iterator[int]:
        yield from steps
        self._final_step = total  # leaving the ``with`` block saves it

    def _job_steps(self, total: int) -> Iterator[int]:
        step = self.start_step
        while step < total:
            self._balance.begin(step)
            yield step
            self._balance.end(step)
            step += 1
            self._boundary(step, total)
        self._final_step = total  # leaving the ``with`` block saves it

    def _saves(self) -> bool:
        """Whether this rank writes the job's checkpoints and progress (in replica groups,
        one group does: rank 0 of the current quorum, the same on every rank of a group)."""
        return all(part.saves() for part in self._parts)

    def _boundary(self, step: int, total: int) -> None:
        ft = self.config.fault_tolerance
        saver = self._saves()
        self._saving(self.manager.maybe_finish)
        for part in self._parts:
            part.on_boundary(step)
        if saver:
            self._report(step)
        waited = time.monotonic()
        stop = signals.agreed()
        for part in self._parts:
            stop = part.agree_stop(stop)
        # The agreement is a collective: time spent in it is time waiting for slower ranks.
        self.heartbeat.step(step, wait_s=time.monotonic() - waited)
        if stop:
            if not saver:  # another group saves; this one just leaves
                self.heartbeat.stop("preempted")
                raise Preempted(step)
            self._save_and_requeue(step)
        for part in self._parts:
            part.after_step(step, total)
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
        elif step < total:
            for part in self._parts:
                part.between_saves(step)

    def _timed_save(self, step: int) -> None:
        """Save, and (rank 0) record what it cost the training loop: the blocking part, and
        the waits of the steps since the previous save for that one's background copy."""
        waited = self.manager.staging_wait_s - self._staging_seen
        start, begun = time.time(), time.perf_counter()
        self.manager.save(step, self.state, {"step": step})
        for part in self._parts:
            part.on_save(step)  # within the stall: the RAM copies are taken with the save
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
        saver = self._saves()
        if saver and final_step is not None and (last is None or last.step != final_step):
            meta = {"step": final_step, "final": True}
            self._note_save(final_step, "final")
            self._saving(lambda: self.manager.save(final_step, self.state, meta), final=True)
            self._saving(self.manager.wait, final=True)
        self.manager.close()
        if saver:
            self._report(final_step if final_step is not None else self.start_step, force=True)
        for part in self._parts:
            part.close(final_step)
        self.heartbeat.stop("closed")

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close(self._final_step)
        elif not issubclass(exc_type, Preempted):
            self.heartbeat.stop("failed")
