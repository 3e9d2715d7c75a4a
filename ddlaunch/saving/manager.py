"""Sharded checkpoints with torch.distributed.checkpoint (DCP): save, commit, retain, resume.

The protocol, for step N (every rank calls save(); it is a collective):

1. Rank 0 looks at ``step-N``: committed already -> every rank skips (a committed checkpoint
   is never rewritten); a stale uncommitted directory -> rank 0 removes it first. Rank 0
   broadcasts the decision so all ranks act on the same view of a shared file system.
2. Every rank writes its own shard with ``dcp.save`` (sync), or (async) stages a CPU copy
   and hands it to the manager's writer thread, which runs steps 1 and 2 while the
   training loop continues: save() itself waits for no other rank. ShardWriter
   (writer.py) fsyncs each shard and ``.metadata``.
3. When the write has finished on every rank (at once for sync; for async at the next
   save(), maybe_finish() or wait()), the ranks all-gather which ranks failed. Only if none
   did does rank 0 write the commit marker (atomic rename, fsync). A failure anywhere
   leaves the directory uncommitted, and every rank raises the same CheckpointSaveError.
4. Only then, rank 0 deletes committed checkpoints beyond keep-last-K and partial
   directories older than N. An older checkpoint is never deleted before the new one is
   durable.

Async staging. save() copies the state into reused CPU buffers (cpu_copy.py), but the
tensors owned by the optimizers of ``TrainState`` entries (parameters, optimizer state),
usually nearly all the bytes, are copied by a background thread while the loop runs the
next forward/backward. Only ``optimizer.step()`` changes them, so a step pre-hook on those
optimizers waits for the copy first: the checkpoint holds exactly the state at the saved
step. maybe_finish(), wait(), save() and close() wait for it as well.

Process groups. DCP's planning runs object collectives; for async saves they run in a
background thread. Collectives issued from two threads on one process group may interleave
differently on different ranks and hang, so the manager creates its own gloo groups: one for
DCP (possibly used by the thread) and, with async saves, another for the main thread's
agreement collectives. Gloo also gives DCP's collectives on the writer thread a CPU backend
(the staged state is on the CPU), whether training runs on gloo or nccl. Creating the
groups is itself a collective: construct the manager on every rank of ``process_group``.

A training loop::

    manager = CheckpointManager(root, keep_last=3, async_save=True)
    state = {"train": TrainState(model, optimizer)}
    info = manager.load_latest(state)                # None on a fresh start
    start = info.step + 1 if info else 0             # info.metadata: e.g. the data position
    for step in range(start, total_steps):
        train_one_step()
        manager.maybe_finish()                       # commits a finished async save
        if manager.should_save(step, every_steps=500, every_minutes=30):
            manager.save(step, state, metadata={"samples_seen": ...})
    manager.close()                                  # waits for and commits the last save
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from ddlaunch.checkpoint import layout
from ddlaunch.checkpoint.layout import CheckpointInfo, CheckpointState, CommitMarker
from ddlaunch.checkpoint.policy import should_checkpoint
from ddlaunch.saving.agreement import (
    Agreement,
    CheckpointError,
    CheckpointSaveError,
    marker_failed,
)
from ddlaunch.saving.cpu_copy import ReusableCpuStager, StagedState, storage_key
from ddlaunch.saving.state import TrainState
from ddlaunch.saving.writer import ShardWriter

__all__ = ["CheckpointError", "CheckpointManager", "CheckpointSaveError", "TrainState"]

log = logging.getLogger(__name__)

# DCP reports a failure on any rank as CheckpointException, which derives from
# BaseException (not Exception): catch it by name, but never KeyboardInterrupt/SystemExit.
_SAVE_ERRORS = (Exception, CheckpointException)

# Decisions rank 0 broadcasts before a save (step 1 of the protocol).
_FRESH, _SKIP = "fresh", "skip"


@dataclass
class _Pending:
    """An async save whose write may still be running."""

    step: int
    path: Path
    future: Future[Any]
    metadata: Mapping[str, Any]
    staging: Future[BaseException | None] | None = None  # the background copy, if any


class CheckpointManager:
    """Saves and resumes sharded checkpoints under ``root/step-N`` (see the module docstring).

    Every public method is a collective over ``process_group`` (default: the world) and
    must be called by all its ranks in the same order. ``keep_last <= 0`` keeps everything.
    With ``async_save=True``, call ``maybe_finish()`` at step boundaries (it commits a
    finished save) and ``close()`` (or ``wait()``) before exiting: a save never waited for
    is never committed. ``overlap_staging=False`` copies everything inside save(), for
    loops that change parameters or optimizer state other than by ``optimizer.step()``.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int,
        async_save: bool = False,
        overlap_staging: bool = True,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise CheckpointError("CheckpointManager needs torch.distributed initialized")
        self.root = Path(root)
        self.keep_last = keep_last
        self.async_save = async_save
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        local = process_group is not None  # only members take part in creating subgroups
        self._dcp_pg = dist.new_group(ranks, backend="gloo", use_local_synchronization=local)
        self._ctl_pg = (
            dist.new_group(ranks, backend="gloo", use_local_synchronization=local)
            if async_save
            else self._dcp_pg
        )
        self.rank = dist.get_rank(self._ctl_pg)
        self.world_size = dist.get_world_size(self._ctl_pg)
        self._agree = Agreement(self._ctl_pg, self.rank, self.world_size, str(self.root))
        self._stager = ReusableCpuStager() if async_save else None
        # Async saves: the writer thread runs steps 1 and 2 of the protocol (its collectives
        # on the DCP group, with an Agreement of its own), so save() itself is local.
        self._writer_thread: ThreadPoolExecutor | None = None
        if async_save:
            self._dcp_agree = Agreement(self._dcp_pg, self.rank, self.world_size, str(self.root))
            self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="ddlaunch-writer")
            self._writer_thread.submit(lambda: None)  # started now, not inside a save
        self.overlap_staging = overlap_staging
        # The background copy of optimizer-owned tensors, and the step pre-hooks that wait
        # for it (one per optimizer, by id; removed at close).
        self._staging: Future[BaseException | None] | None = None
        self._hooks: dict[int, Any] = {}
        self.staging_wait_s = 0.0  # total time the hooks and boundaries waited (benchmarks)
        self._last_staged: StagedState | None = None  # what the last save() staged
        self._pending: _Pending | None = None
        self._closed = False
        self.last_committed: CheckpointInfo | None = None
        # For should_save(): the time trigger counts from construction (the job's start).
        self._last_save_step: int | None = None
        self._last_save_time = time.time()

    # ---------------------------------------------------------------- public API

    @property
    def pending_step(self) -> int | None:
        """Step of an async save that has not been committed yet."""
        return self._pending.step if self._pending else None

    def should_save(
        self, step: int, *, every_steps: int | None = None, every_minutes: float | None = None
    ) -> bool:
        """The policy of policy.should_checkpoint, agreed across ranks (any rank -> all).

        Clocks differ between ranks, so the time trigger needs the agreement; step-only
        policies are deterministic and skip the collective.
        """
        due = should_checkpoint(
            step,
            time.time(),
            self._last_save_step,
            self._last_save_time,
            every_steps,
            every_minutes,
        )
        if not every_minutes:
            return due
        return any(self._agree.gather_flags(due))

    def everywhere(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank: a collective on the manager's control group,
        on the training loop's thread (every rank calls it at the same point)."""
        return self._agree.all_true(flag)

    def save(
        self,
        step: int,
        state_dict: dict[str, Any],
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo | None:
        """Save ``state_dict`` (this rank's shard) as step ``step``.

        Sync: returns the committed CheckpointInfo. Async: returns None once the state is
        staged (the caller may then modify it); the commit happens later. Tensors owned by
        the optimizers of ``TrainState`` entries are still being copied then: change them
        only through ``optimizer.step()``, which waits for the copy (see the module doc).
        Returns None without writing when ``step`` is committed already. ``metadata`` (JSON)
        is stored in the commit marker; rank 0's copy is the one recorded. Raises
        CheckpointSaveError on every rank when any rank failed, including a previous async
        save that failed (this save is then not attempted; call save() again to retry).
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        meta = dict(metadata or {})
        json.dumps(meta)  # fail here, on the caller's rank, before any collective
        self.wait()  # one save in flight at a time: it also frees the staging buffers
        self._last_staged = None
        path = self.root / layout.step_dir_name(step)
        if self.async_save:
            # Stage (local), then leave everything collective to the writer thread: the
            # loop waits for no other rank here. A skipped step is wasted staging, rarely.
            staged = self._stage(state_dict)
            self._last_save_step, self._last_save_time = step, time.time()
            assert self._writer_thread is not None
            future = self._writer_thread.submit(
                self._write_async, staged, self._staging, step, path
            )
            self._pending = _Pending(step, path, future, meta, self._staging)
            if isinstance(staged, StagedState):
                self._last_staged = staged
            return None
        if self._agree.on_rank0(lambda: self._prepare_dir(step, path)) == _SKIP:
            log.warning("step %d is committed already; not saving it again", step)
            return None
        self._last_save_step, self._last_save_time = step, time.time()
        future = Future()
        try:
            future.set_result(
                dcp.save(state_dict, storage_writer=self._writer(path), process_group=self._dcp_pg)
            )
        except _SAVE_ERRORS as exc:  # reported to all ranks by _commit
            future.set_exception(exc)
        return self._commit(_Pending(step, path, future, meta))

    def copy_staged(self, read: Callable[[dict[str, Any]], Any]) -> Future[Any] | None:
        """``read(staged)`` on the last async save's staged copy of the state, once it is
        complete, on the staging thread (local, not a collective); None when the last
        save() staged nothing (a sync manager, a skipped step). The staged copy holds the
        saved step until the next save() or prepare_staging(), which wait for ``read``."""
        if self._stager is None or self._last_staged is None:
            return None
        return self._stager.after_copy(self._last_staged, read)

    def maybe_finish(self) -> CheckpointInfo | None:
        """Commit a pending async save if every rank's write has finished.

        Never waits for the write; while a save is pending it costs one small collective,
        so call it on every rank at step boundaries. Returns the info of the checkpoint
        committed by this call, else None.
        """
        if self._pending is None:
            return None
        # The optimizer hook normally waited already; this covers loops that had no
        # optimizer.step() since save() (gradient accumulation), at the latest one step on.
        self.wait_staging()
        if not all(self._agree.gather_flags(self._pending.future.done())):
            return None
        return self.wait()

    def wait(self) -> CheckpointInfo | None:
        """Block until a pending async save is written, then commit it (None if none)."""
        self.wait_staging()
        pending, self._pending = self._pending, None
        return self._commit(pending) if pending is not None else None

    def wait_staging(self) -> None:
        """Block until the background copy of the last save is done (local, not a
        collective). After it, every tensor of the saved state may change."""
        staging, self._staging = self._staging, None
        if staging is None or staging.done():
            return
        start = time.perf_counter()
        staging.result()  # never raises: a copy error is reported by the commit
        self.staging_wait_s += time.perf_counter() - start

    def load_latest(self, state_dict: dict[str, Any]) -> CheckpointInfo | None:
        """Load the newest COMPLETE checkpoint into ``state_dict`` in place (None if none).

        DCP reshards: the saving and loading world sizes may differ for DTensor/sharded
        state; plain tensors must be replicated (same full value on every rank). With
        ``async_save``, it also prepares the staging buffers (see prepare_staging).
        """
        self.wait()
        info = self._agree.on_rank0(lambda: layout.latest_complete(self.root))
        if info is not None:
            dcp.load(
                state_dict,
                storage_reader=dcp.FileSystemReader(info.path),
                process_group=self._dcp_pg,
            )
            self._last_save_step, self.last_committed = info.step, info
        self.prepare_staging(state_dict)
        return info

    def latest_complete(self) -> CheckpointInfo | None:
        """The newest complete checkpoint on disk, as rank 0 finds it (the same on every
        rank)."""
        info: CheckpointInfo | None = self._agree.on_rank0(
            lambda: layout.latest_complete(self.root)
        )
        return info

    def adopt(self, info: CheckpointInfo, state_dict: dict[str, Any]) -> None:
        """The state was restored from ``info``'s step by other means (its copy in RAM):
        from here on it is the last committed checkpoint, as after ``load_latest``."""
        self._last_save_step, self.last_committed = info.step, info
        self.prepare_staging(state_dict)

    def prepare_staging(self, state_dict: dict[str, Any]) -> None:
        """Allocate (and touch) the async staging buffers now, at start-up, where a stall
        is free; otherwise the first async save pays for it (several times a warm save).
        Local, not a collective; a no-op for sync managers."""
        if self._stager is not None:
            self._last_staged = None
            self._stager.stage(_without_stateful(state_dict))

    def close(self) -> None:
        """Commit any pending save and release the staging buffers and process groups."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._release_local()
            for group in {self._dcp_pg, self._ctl_pg}:
                dist.destroy_process_group(group)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
            return
        # An exception may be unwinding on this rank only: a collective (wait) could hang.
        # Leave a pending save uncommitted, which is always safe, and release local state.
        if self._pending is not None:
            log.warning("abandoning uncommitted async save of step %d", self._pending.step)
            self._pending = None
        self._release_local()
        self._closed = True

    def _release_local(self) -> None:
        """Remove the step hooks and free the staging buffers (a running copy keeps its own
        references; the hooks must not outlive the manager, or a later step would wait on
        a manager that is gone)."""
        self._staging = self._last_staged = None
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        if self._stager is not None:
            self._stager.close()
        if self._writer_thread is not None:
            self._writer_thread.shutdown(wait=False)  # a running write keeps its references
            self._writer_thread = None

    # ---------------------------------------------------------------- internals

    def _writer(self, path: Path) -> dcp.FileSystemWriter:
        # Every file fsynced, overwrite refused (_prepare_dir emptied the directory), the
        # shards without zip CRC32s (writer.py says why).
        return ShardWriter(path)

    def _stage(self, state_dict: dict[str, Any]) -> StagedState | BaseException:
        """Copy the state into the staging buffers and start the background copy of the
        optimizer-owned tensors (``self._staging``); local, so an error is returned, for
        _start_write to agree on."""
        assert self._stager is not None
        try:
            defer = self._guard_optimizers(state_dict) if self.overlap_staging else None
            staged = self._stager.stage(_without_stateful(state_dict), defer)
        except Exception as exc:
            return exc
        if not staged.complete:
            self._staging = self._stager.start_deferred(staged)
        return staged

    def _write_async(
        self,
        staged: StagedState | BaseException,
        staging: Future[BaseException | None] | None,
        step: int,
        path: Path,
    ) -> Any:
        """On the writer thread, every rank together: steps 1 and 2 of the protocol for an
        async save; returns DCP's metadata, or _SKIP for a committed step."""
        if self._dcp_agree.on_rank0(lambda: self._prepare_dir(step, path)) == _SKIP:
            log.warning("step %d is committed already; not saving it again", step)
            return _SKIP
        # Agree before any rank enters DCP's collectives: a rank that failed to stage would
        # otherwise leave the others blocked in them until the collective timeout.
        error = staged if isinstance(staged, BaseException) else None
        self._dcp_agree.raise_unless_all(error is None, "staging", step, error)
        assert isinstance(staged, StagedState)
        if staging is not None:
            staging.result()  # the background copy; its error is reported by the commit
        writer = self._writer(path)
        writer.per_thread_copy_ahead = 0  # the state is on the CPU already
        return dcp.save(staged.state_dict, storage_writer=writer, process_group=self._dcp_pg)

    def _guard_optimizers(self, state_dict: dict[str, Any]) -> Callable[[torch.Tensor], bool]:
        """Hook the optimizers of the TrainState entries to wait for the background copy;
        return the test for "only optimizer.step() changes this tensor", which may then be
        copied in the background. Parameters outside every optimizer (frozen ones), buffers
        (batch-norm statistics change in the forward pass) and everything else are not."""
        owned: set[int] = set()
        for value in state_dict.values():
            for optimizer in value.optimizers if isinstance(value, TrainState) else ():
                if id(optimizer) not in self._hooks:
                    self._hooks[id(optimizer)] = optimizer.register_step_pre_hook(
                        lambda *_: self.wait_staging()
                    )
                owned |= _optimizer_storages(optimizer)
        owned.discard(0)  # empty tensors: nothing to copy, and their key is shared
        return lambda tensor: storage_key(tensor) in owned

    def _commit(self, pending: _Pending) -> CheckpointInfo | None:
        """Steps 3 and 4 of the protocol for a write that was started on every rank (None:
        an async save of a committed step, skipped on every rank)."""
        error: BaseException | None = None
        metadata = None
        try:
            metadata = pending.future.result()
        except CheckpointSaveError:
            raise  # agreed on every rank already, by the writer thread
        except _SAVE_ERRORS as exc:
            error = exc
        if metadata is _SKIP:
            return None
        if error is None and pending.staging is not None:
            # DCP wrote whatever the buffers held: a failed copy must not be committed.
            error = pending.staging.result()
        self._agree.raise_unless_all(error is None, "write", pending.step, error)

        def write_marker() -> CheckpointInfo:
            marker = CommitMarker(
                step=pending.step,
                time=time.time(),
                world_size=self.world_size,
                num_shard_files=_count_shard_files(metadata),
                metadata=pending.metadata,
            )
            layout.write_commit_marker(pending.path, marker)
            return CheckpointInfo(
                step=pending.step,
                path=pending.path,
                state=CheckpointState.COMPLETE,
                marker=marker,
            )

        try:
            info = self._agree.on_rank0(write_marker)
        except CheckpointError as exc:
            raise marker_failed(exc, pending.step, str(self.root)) from exc
        self.last_committed = info
        log.info("checkpoint step %d committed at %s", info.step, info.path)
        if self.rank == 0:
            self._retain(info.step)
        return info

    def _retain(self, committed_step: int) -> None:
        """Best effort: a failed cleanup must not fail a committed save (rank 0 only)."""
        try:
            for path in layout.prune(self.root, self.keep_last, protect=(committed_step,)):
                log.info("deleted old checkpoint %s (keep_last=%d)", path, self.keep_last)
            for path in layout.remove_partial(self.root, keep_newer_than_step=committed_step):
                log.info("deleted uncommitted checkpoint directory %s", path)
        except OSError as exc:
            log.warning("checkpoint retention failed under %s: %s", self.root, exc)

    def _prepare_dir(self, step: int, path: Path) -> str:
        """Rank 0: skip a committed step; clear a stale uncommitted one."""
        if not path.exists():
            return _FRESH
        if layout.inspect_step_dir(path, step).complete:
            return _SKIP
        # Left by a crashed or failed attempt of this run: its shards may come from another
        # world size, so start from an empty directory.
        log.warning("removing uncommitted checkpoint directory %s before saving", path)
        layout.delete_checkpoint(path)
        return _FRESH


def _without_stateful(state_dict: dict[str, Any]) -> dict[str, Any]:
    # DCP turns top-level Stateful objects into their state dicts before staging; so do we.
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


def _optimizer_storages(optimizer: torch.optim.Optimizer) -> set[int]:
    """The memory of the parameters an optimizer updates and of its state tensors."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    for per_param in optimizer.state.values():
        tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return {storage_key(t) for t in tensors}


def _count_shard_files(metadata: Any) -> int:
    """Distinct data files DCP's metadata refers to (0 if it does not say)."""
    storage = getattr(metadata, "storage_data", None) or {}
    return len({getattr(info, "relative_path", None) for info in storage.values()})
