"""Scenarios run on spawned gloo ranks by test_checkpoint_dcp.py.

Each rank records what it observed in ``obs-<phase>-rank<R>.json``; the tests assert on
those files in the parent process, so one spawn serves many tests (spawning torch ranks is
the expensive part on a small machine). An unexpected exception fails the whole phase.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from ddlaunch.checkpoint import COMMIT_MARKER, latest_complete, list_checkpoints
from ddlaunch.saving import CheckpointManager, CheckpointSaveError, TrainState, cpu_copy

RESHARD_STEP = 7
RESHARD_ROWS = 10  # not a multiple of 4: DTensor shards of 3, 3, 3, 1 rows


_SEEDS = {"dt": 1234, "rep": 5678}


def expected_full(name: str, rows: int = RESHARD_ROWS) -> torch.Tensor:
    """Deterministic full tensor, the same on every rank and in every phase."""
    gen = torch.Generator().manual_seed(_SEEDS[name])
    return torch.randn(rows, 3, generator=gen, dtype=torch.float64)


def _replicated(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def _barrier() -> None:
    dist.barrier()


class _Recorder:
    def __init__(self, out: Path, phase: str, rank: int) -> None:
        self.path = out / f"obs-{phase}-rank{rank}.json"
        self.data: dict[str, Any] = {"_elapsed": {}}
        self.start = time.monotonic()

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        # Seconds since the phase began: shows where the test time goes.
        self.data["_elapsed"][key] = round(time.monotonic() - self.start, 2)
        self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # Compare bits, not values: NaN != NaN and -0.0 == 0.0 would hide differences.
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _equal_nested(a: Any, b: Any) -> bool:
    """Bit-identical comparison of nested dicts/lists of tensors and scalars."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(_bytes(a), _bytes(b)))
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_equal_nested(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal_nested(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_clone(v) for v in obj)
    return obj


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(5, 8, generator=gen)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def _fail_writes_on(rank: int, failing_rank: int) -> Any:
    """Make this rank's shard write raise (a full disk), as the write would on a bad node."""
    original = FileSystemWriter.write_data
    if rank == failing_rank:

        def broken(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
            raise OSError(28, "No space left on device (simulated)")

        FileSystemWriter.write_data = broken  # type: ignore[method-assign]
    return original


def _roundtrip(rank: int, world: int, root: Path, rec: _Recorder, tag: str) -> None:
    """Sync save of mixed state, clobber it, load it back: everything must be bit-identical."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # same model on every rank: replicated state
    model = nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train_step(model, opt, seed=1)
    state: dict[str, Any] = {
        "train": TrainState(model, opt),
        "rep_f32": _replicated(11, 33, 7),
        "rep_bf16": _replicated(12, 64, dtype=torch.bfloat16),
        "rep_i64": torch.arange(-50, 50, dtype=torch.int64) * 7919,
        "dt": distribute_tensor(expected_full("dt"), mesh, [Shard(0)]),
        "extra": {"epoch": 3, "name": "run-α"},
    }
    saved = _clone({k: v for k, v in state.items() if k != "train"})
    saved_local_dt = state["dt"].to_local().clone()
    saved_train = _clone(TrainState(model, opt).state_dict())
    with CheckpointManager(root, keep_last=0) as manager:
        info = manager.save(5, state, metadata={"data_pos": 123, "tag": tag})
        rec[f"{tag}.save_returned_step"] = info.step if info else None
        # Clobber everything, then load in place.
        _train_step(model, opt, seed=2)
        for key in ("rep_f32", "rep_bf16", "rep_i64"):
            state[key].zero_()
        state["dt"].to_local().zero_()
        state["extra"] = {"epoch": 0, "name": ""}
        loaded = manager.load_latest(state)
    rec[f"{tag}.loaded_step"] = loaded.step if loaded else None
    rec[f"{tag}.loaded_metadata"] = dict(loaded.metadata) if loaded else None
    rec[f"{tag}.marker_world_size"] = loaded.marker.world_size if loaded and loaded.marker else 0
    for key in ("rep_f32", "rep_bf16", "rep_i64", "extra"):
        rec[f"{tag}.identical.{key}"] = _equal_nested(saved[key], state[key])
    rec[f"{tag}.identical.dt_local"] = _equal_nested(saved_local_dt, state["dt"].to_local())
    rec[f"{tag}.identical.model_optim"] = _equal_nested(
        saved_train, TrainState(model, opt).state_dict()
    )
    if rank == 0 and loaded is not None and loaded.marker is not None:
        rec[f"{tag}.num_shard_files"] = loaded.marker.num_shard_files
        rec[f"{tag}.distcp_files"] = len(list(loaded.path.glob("*.distcp")))


def _reshard_state(world: int) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    return {
        "dt": distribute_tensor(
            torch.zeros(RESHARD_ROWS, 3, dtype=torch.float64), mesh, [Shard(0)]
        ),
        "rep": torch.zeros(RESHARD_ROWS, 3, dtype=torch.float64),
    }


def _reshard_save(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    mesh = init_device_mesh("cpu", (world,))
    state = {
        "dt": distribute_tensor(expected_full("dt"), mesh, [Shard(0)]),
        "rep": expected_full("rep"),
    }
    rec["reshard.saved_local_rows"] = state["dt"].to_local().shape[0]
    with CheckpointManager(root, keep_last=1) as manager:
        manager.save(RESHARD_STEP, state, metadata={"saved_world": world})


def _reshard_load(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    state = _reshard_state(world)
    with CheckpointManager(root, keep_last=1) as manager:
        info = manager.load_latest(state)
    dt = state["dt"]
    assert isinstance(dt, DTensor)
    rec["reshard.loaded_step"] = info.step if info else None
    rec["reshard.saved_world"] = info.marker.world_size if info and info.marker else None
    rec["reshard.local_rows"] = dt.to_local().shape[0]
    rec["reshard.dt_full_identical"] = _equal_nested(expected_full("dt"), dt.full_tensor())
    rec["reshard.rep_identical"] = _equal_nested(expected_full("rep"), state["rep"])


def _retention_and_failure(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """keep_last=2 after 4 saves; then a save that fails on rank 1 deletes nothing."""
    state = {"w": torch.zeros(16)}
    with CheckpointManager(root, keep_last=2) as manager:
        for step in (1, 2, 3, 4):
            state["w"].fill_(step)
            manager.save(step, state)
        _barrier()  # retention runs on rank 0 after the commit; let it finish before looking
        rec["retain.after_4"] = [(i.step, i.state.value) for i in list_checkpoints(root)]
        original = _fail_writes_on(rank, failing_rank=1)
        state["w"].fill_(5)
        try:
            manager.save(5, state)
            rec["retain.failed_save_raised"] = None
        except CheckpointSaveError as exc:
            rec["retain.failed_save_raised"] = exc.failed_ranks
            rec["retain.failed_reason"] = getattr(exc, "reason", None)
        finally:
            FileSystemWriter.write_data = original  # type: ignore[method-assign]
        _barrier()
        rec["retain.after_failure"] = [(i.step, i.state.value) for i in list_checkpoints(root)]
        rec["retain.step5_has_marker"] = (root / "step-5" / COMMIT_MARKER).exists()
        latest = latest_complete(root)
        rec["retain.latest_complete"] = latest.step if latest else None
        state["w"].zero_()
        info = manager.load_latest(state)
        rec["retain.loaded_step"] = info.step if info else None
        rec["retain.loaded_value"] = float(state["w"][0])
        # The stale step-5 directory is cleared and rewritten by the next save of step 5.
        state["w"].fill_(5)
        info = manager.save(5, state)
        rec["retain.resaved_step"] = info.step if info else None
        _barrier()
        rec["retain.final"] = [(i.step, i.state.value) for i in list_checkpoints(root)]


def _uncommitted_metadata(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """.metadata present but no marker (a crash between DCP's finish and our commit)."""
    state = {"w": torch.zeros(8)}
    with CheckpointManager(root, keep_last=0) as manager:
        for step in (10, 11):
            state["w"].fill_(step)
            manager.save(step, state)
        if rank == 0:
            (root / "step-11" / COMMIT_MARKER).unlink()
        _barrier()
        rec["uncommitted.step11_has_metadata"] = (root / "step-11" / ".metadata").exists()
        latest = latest_complete(root)
        rec["uncommitted.latest_complete"] = latest.step if latest else None
        state["w"].zero_()
        info = manager.load_latest(state)
        rec["uncommitted.loaded_step"] = info.step if info else None
        rec["uncommitted.loaded_value"] = float(state["w"][0])
        # A committed step is never rewritten: saving step 10 again is skipped.
        marker_before = (root / "step-10" / COMMIT_MARKER).read_bytes()
        state["w"].fill_(-1)
        rec["uncommitted.resave_committed"] = manager.save(10, state) is None
        _barrier()
        rec["uncommitted.marker_unchanged"] = (
            root / "step-10" / COMMIT_MARKER
        ).read_bytes() == marker_before
        # should_save's time trigger: only rank 1's clock says "due"; all ranks must agree.
        manager._last_save_time = 0.0 if rank == 1 else time.time()
        rec["uncommitted.time_trigger_agreed"] = manager.should_save(12, every_minutes=1)
        rec["uncommitted.step_trigger"] = [
            manager.should_save(s, every_steps=4) for s in (11, 12, 13)
        ]


def _async(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """Async saves: commit only at wait()/maybe_finish(); mutation after save() is safe."""
    big = torch.zeros(512, 1024)  # 2 MiB: the write takes a moment while we mutate
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train_step(model, opt, seed=1)
    mesh = init_device_mesh("cpu", (world,))
    dt = distribute_tensor(expected_full("dt"), mesh, [Shard(0)])
    state: dict[str, Any] = {"w": big, "n": 0, "train": TrainState(model, opt), "dt": dt}
    with CheckpointManager(root, keep_last=2, async_save=True) as manager:
        big.fill_(1.0)
        state["n"] = 1
        returned = manager.save(1, state, metadata={"data_pos": 1})
        # Training goes on: update in place right away, while the write may be running.
        big.fill_(999.0)
        state["n"] = 999
        rec["async.save_returned"] = returned is None
        rec["async.pending_step"] = manager.pending_step
        _barrier()  # everyone is past save(); nobody has committed: no marker may exist
        rec["async.marker_before_wait"] = (root / "step-1" / COMMIT_MARKER).exists()
        info = manager.wait()
        rec["async.wait_committed"] = info.step if info else None
        rec["async.marker_after_wait"] = (root / "step-1" / COMMIT_MARKER).exists()

        # Second save: committed through maybe_finish() polling at "step boundaries".
        big.fill_(2.0)
        state["n"] = 2
        train_at_2 = _clone(TrainState(model, opt).state_dict())
        manager.save(2, state)
        big.fill_(-7.0)
        state["n"] = -7
        dt.to_local().fill_(-7.0)
        _train_step(model, opt, seed=3)  # the optimizer updates parameters in place
        committed = None
        deadline = time.monotonic() + 30
        while committed is None and time.monotonic() < deadline:
            committed = manager.maybe_finish()
            time.sleep(0.01)
        rec["async.maybe_finish_committed"] = committed.step if committed else None

        # Third save fails on rank 1 in the writer thread: wait() raises on every rank.
        original = _fail_writes_on(rank, failing_rank=1)
        try:
            manager.save(3, state)
            manager.wait()
            rec["async.failed_raised"] = None
        except CheckpointSaveError as exc:
            rec["async.failed_raised"] = exc.failed_ranks
        finally:
            FileSystemWriter.write_data = original  # type: ignore[method-assign]
        _barrier()
        rec["async.after_failure"] = [(i.step, i.state.value) for i in list_checkpoints(root)]

    # Load step 2 back with a sync manager: the pre-mutation values, not -7 or 999.
    torch.manual_seed(99)  # a different initialisation, and an optimizer that never stepped
    model2 = nn.Linear(8, 4)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    fresh = {
        "w": torch.zeros(512, 1024),
        "n": 0,
        "train": TrainState(model2, opt2),
        "dt": distribute_tensor(
            torch.zeros(RESHARD_ROWS, 3, dtype=torch.float64), mesh, [Shard(0)]
        ),
    }
    with CheckpointManager(root, keep_last=0) as loader:
        info = loader.load_latest(fresh)
    rec["async.dt_identical"] = _equal_nested(expected_full("dt"), fresh["dt"].full_tensor())
    rec["async.train_identical"] = _equal_nested(train_at_2, TrainState(model2, opt2).state_dict())
    rec["async.loaded_step"] = info.step if info else None
    rec["async.loaded_unique_values"] = sorted({float(v) for v in fresh["w"].unique()})
    rec["async.loaded_n"] = fresh["n"]
    # And step 1, read directly: 1.0 everywhere, n == 1.
    import torch.distributed.checkpoint as dcp

    one = {"w": torch.zeros(512, 1024), "n": 0}
    dcp.load(one, checkpoint_id=root / "step-1")
    rec["async.step1_unique_values"] = sorted({float(v) for v in one["w"].unique()})
    rec["async.step1_n"] = one["n"]


COPY_DELAY_S = 0.5  # the background copy is held back this long in _async_overlap


def _slow_background_copy(delay: float, fail: bool = False) -> Any:
    """Hold back the background copy of optimizer-owned tensors (or make it fail), so the
    training loop surely reaches optimizer.step() while the copy has not run yet."""
    original = cpu_copy.copy_pairs

    def slow(pairs: Any) -> None:
        time.sleep(delay)
        if fail:
            raise MemoryError("staging copy failed (simulated)")
        original(pairs)

    cpu_copy.copy_pairs = slow  # type: ignore[assignment]
    return original


def _async_overlap(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """The copy of parameters and optimizer state overlaps the next step; the optimizer's
    step waits for it, so the checkpoint holds the values at save() and not after it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    _train_step(model, opt, seed=1)  # Adam's state exists from here on
    state: dict[str, Any] = {"train": TrainState(model, opt)}
    hooks_before = len(opt._optimizer_step_pre_hooks)
    original = _slow_background_copy(COPY_DELAY_S)
    try:
        with CheckpointManager(root, keep_last=0, async_save=True) as manager:
            at_save = _clone(TrainState(model, opt).state_dict())
            start = time.perf_counter()
            manager.save(1, state)
            rec["overlap.save_s"] = time.perf_counter() - start
            # The next step right away: its forward updates the batch-norm statistics (copied
            # inside save()), its optimizer step the parameters and Adam's moments (copied in
            # the background, which the step pre-hook waits for).
            _train_step(model, opt, seed=2)
            rec["overlap.hook_waited_s"] = manager.staging_wait_s
            rec["overlap.changed_by_step"] = not _equal_nested(
                at_save, TrainState(model, opt).state_dict()
            )
            info = manager.wait()
            rec["overlap.committed"] = info.step if info else None
            # A failed background copy leaves the save uncommitted on every rank.
            cpu_copy.copy_pairs = original  # type: ignore[assignment]
            _slow_background_copy(0.0, fail=rank == 1)
            try:
                manager.save(2, state)
                manager.wait()
                rec["overlap.failed_copy_raised"] = None
            except CheckpointSaveError as exc:
                rec["overlap.failed_copy_raised"] = exc.failed_ranks
        rec["overlap.hooks_left"] = len(opt._optimizer_step_pre_hooks) - hooks_before
        # overlap_staging=False: all is copied inside save(); the step has nothing to wait
        # for (a deferred copy would be held back, and waited for, again).
        cpu_copy.copy_pairs = original  # type: ignore[assignment]
        _slow_background_copy(COPY_DELAY_S)
        with CheckpointManager(
            root / "no-overlap", keep_last=0, async_save=True, overlap_staging=False
        ) as manager:
            at_save3 = _clone(TrainState(model, opt).state_dict())
            manager.save(3, state)
            _train_step(model, opt, seed=3)
            rec["nooverlap.hook_waited_s"] = manager.staging_wait_s
            manager.wait()
    finally:
        cpu_copy.copy_pairs = original  # type: ignore[assignment]
    _barrier()
    rec["overlap.checkpoints"] = [(i.step, i.state.value) for i in list_checkpoints(root)]
    for key, where, expected in (
        ("overlap", root, at_save),
        ("nooverlap", root / "no-overlap", at_save3),
    ):
        torch.manual_seed(99)
        model2 = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.Linear(64, 4))
        opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
        with CheckpointManager(where, keep_last=0) as loader:
            info = loader.load_latest({"train": TrainState(model2, opt2)})
        rec[f"{key}.loaded_step"] = info.step if info else None
        rec[f"{key}.identical"] = _equal_nested(expected, TrainState(model2, opt2).state_dict())


def _session_save_failures(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """The training Session when the save of step 4 fails on rank 1 only (a full disk
    there): ``stop`` (async saves) ends the loop on every rank with the reason, ``continue``
    (sync saves) trains on and commits the later saves."""
    import os
    from dataclasses import replace

    from ddlaunch.config.schema import Config
    from ddlaunch.train import Session

    original = FileSystemWriter.write_data

    def full_at_step_4(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        if str(self.path).endswith("step-4") and dist.get_rank() == 1:
            raise OSError(28, "No space left on device (simulated)")
        return original(self, plan, planner)

    FileSystemWriter.write_data = full_at_step_4  # type: ignore[method-assign]
    try:
        for mode, async_save in (("stop", True), ("continue", False)):
            run = root / mode
            os.environ["DDLAUNCH_RUN_DIR"] = str(run)
            os.environ["DDLAUNCH_CHECKPOINT_DIR"] = str(run / "ckpt")
            base = Config()
            cfg = replace(
                base,
                fault_tolerance=replace(
                    base.fault_tolerance,
                    checkpoint_every_steps=2,
                    keep_last=0,
                    async_save=async_save,
                    on_save_failure=mode,
                ),
            )
            torch.manual_seed(0)
            model = nn.Linear(8, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            reached = -1
            try:
                with Session(cfg, model, opt) as session:
                    for step in session.steps(8):
                        _train_step(model, opt, seed=step)
                        reached = step
                rec[f"session.{mode}.raised"] = None
            except CheckpointSaveError as exc:
                rec[f"session.{mode}.raised"] = exc.reason
            rec[f"session.{mode}.reached"] = reached
            _barrier()
            infos = list_checkpoints(run / "ckpt")
            rec[f"session.{mode}.committed"] = [i.step for i in infos if i.complete]
    finally:
        FileSystemWriter.write_data = original  # type: ignore[method-assign]


def _session_staging(rank: int, world: int, root: Path, rec: _Recorder) -> None:
    """A fresh run's Session with async saves (Adam): the staging buffers exist once the
    Session has started, and its saves copy into them (the same memory); a second Session
    on the run resumes from disk, trains on and saves a checkpoint that holds exactly its
    weights and optimizer state."""
    import os
    from dataclasses import replace

    from ddlaunch.config.schema import Config
    from ddlaunch.saving import CheckpointManager, TrainState
    from ddlaunch.train import Session

    os.environ["DDLAUNCH_RUN_DIR"] = str(root)
    os.environ["DDLAUNCH_CHECKPOINT_DIR"] = str(root / "ckpt")
    base = Config()
    cfg = replace(
        base,
        fault_tolerance=replace(
            base.fault_tolerance, checkpoint_every_steps=2, keep_last=0, async_save=True
        ),
    )

    def buffers(session: Session) -> list[int]:
        stager = session.manager._stager
        assert stager is not None
        return sorted(t.untyped_storage().data_ptr() for t in stager.tensors())

    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with Session(cfg, model, opt) as session:
        started = buffers(session)
        rec["session.staging.at_start"] = len(started)
        for step in session.steps(4):
            _train_step(model, opt, seed=step)
        last = session.manager.last_committed
        rec["session.staging.saved_step"] = session.manager.pending_step or (
            last.step if last else None
        )
        rec["session.staging.same_buffers"] = buffers(session) == started
    _barrier()
    model = nn.Linear(8, 2)  # a new process would start from other weights
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with Session(cfg, model, opt) as session:
        rec["session.staging.resumed_at"] = session.start_step
        for step in session.steps(7):
            _train_step(model, opt, seed=step)
    _barrier()
    fresh = nn.Linear(8, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    with CheckpointManager(root / "ckpt", keep_last=0) as manager:
        info = manager.load_latest({"train": TrainState(fresh, fresh_opt)})
    rec["session.staging.loaded_step"] = info.step if info else None
    rec["session.staging.weights_equal"] = _equal_nested(
        model.state_dict(), fresh.state_dict()
    ) and _equal_nested(opt.state_dict()["state"], fresh_opt.state_dict()["state"])


def phase_world4(rank: int, world: int, out: str) -> None:
    """World size 4: a bit-identical round trip, and the source of the reshard test."""
    out_path = Path(out)
    rec = _Recorder(out_path, "w4", rank)
    _roundtrip(rank, world, out_path / "roundtrip4", rec, tag="w4")
    _reshard_save(rank, world, out_path / "reshard", rec)


def phase_world2(rank: int, world: int, out: str) -> None:
    """World size 2: reshard load, round trip, retention, failures, uncommitted, async."""
    out_path = Path(out)
    rec = _Recorder(out_path, "w2", rank)
    _reshard_load(rank, world, out_path / "reshard", rec)
    _roundtrip(rank, world, out_path / "roundtrip2", rec, tag="w2")
    _retention_and_failure(rank, world, out_path / "retain", rec)
    _uncommitted_metadata(rank, world, out_path / "uncommitted", rec)
    _async(rank, world, out_path / "async", rec)
    _async_overlap(rank, world, out_path / "overlap", rec)
    try:  # its own failure fails its own test only (the records above stay)
        _session_save_failures(rank, world, out_path / "session", rec)
    except Exception as exc:
        rec["session.error"] = f"{type(exc).__name__}: {exc}"
    try:
        _session_staging(rank, world, out_path / "staging", rec)
    except Exception as exc:
        rec["session.staging.error"] = f"{type(exc).__name__}: {exc}"
