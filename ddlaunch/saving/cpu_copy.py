"""CPU staging for asynchronous saves, with buffers reused from one checkpoint to the next.

An async save writes a CPU copy of the state (``dcp.save`` on the manager's writer thread)
while the training loop goes on updating the original. DCP's default stager allocates a
fresh copy every time, and first-touching that memory costs about 10x the copy itself (0.4 s
vs 0.03 s for 256 MiB on our test machine). Its caching variant
(``cache_staged_state_dict=True``) pins memory, which raises on CPU-only torch builds. So
ddlaunch keeps its own cache: pinned when CUDA is present (fast device-to-host copies), plain
otherwise, rebuilt whenever the state's tensor layout changes (e.g. optimizer state appears
after the first step).

Copying into the cache was the whole visible stall of an async save (0.11-0.17 s of a 2.4 s
sync save for 1 GiB on 4 ranks), so the copy may be split in two (``defer``): tensors that
something else guarantees not to change for a while (in practice: those only the optimizer
updates, guarded by a step pre-hook in CheckpointManager) are copied by a background thread,
everything else before stage() returns. torch's copy releases the GIL, so the background
copy overlaps the next forward/backward.

The cache is reused by the next save, so the caller must not stage again while a previous
staged copy is still being written (CheckpointManager finishes the pending save first).
Others may read a staged copy on the staging thread (``after_copy``: the in-process
restart's memory checkpoint copies it from there); stage() waits for those reads before it
overwrites the cache.

``CpuCopy`` is the same reuse for a synchronous copy: one set of buffers, allocated once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.tensor import DTensor

# (source, destination): a copy into the cache that stage() left to the background thread.
CopyPair = tuple[torch.Tensor, torch.Tensor]

_IMMUTABLE = (int, float, bool, str, bytes, type(None))


def _layout(obj: Any, path: str = "") -> list[tuple[Any, ...]]:
    """The tensor layout of a (nested) state dict: what a cached copy must match."""
    if isinstance(obj, DTensor):
        local = obj.to_local()
        return [
            (path, "dtensor", obj.dtype, tuple(obj.shape), tuple(local.shape), str(obj.placements))
        ]
    if isinstance(obj, torch.Tensor):
        return [(path, "tensor", obj.dtype, tuple(obj.shape))]
    if isinstance(obj, dict):
        out: list[tuple[Any, ...]] = [(path, "dict", tuple(obj))]
        for key, value in obj.items():
            out += _layout(value, f"{path}/{key}")
        return out
    if isinstance(obj, list | tuple):
        out = [(path, type(obj).__name__, len(obj))]
        for index, value in enumerate(obj):
            out += _layout(value, f"{path}/{index}")
        return out
    return []  # scalars and other objects are copied afresh each time, not cached


def _is_plain(tensor: torch.Tensor) -> bool:
    # Plain tensors and Parameters are copied here; other subclasses (ShardedTensor, ...)
    # are left to torch's own helpers, which know their internals.
    return type(tensor) is torch.Tensor or isinstance(tensor, torch.nn.Parameter)


def _empty_like_on_cpu(obj: Any, pin: bool) -> Any:
    """Uninitialised CPU buffers shaped like every tensor in ``obj`` (other leaves as-is).

    torch's _create_cpu_state_dict deep-copies each DTensor before swapping in an empty
    local tensor: a transient extra copy of the whole shard, which doubled both the memory
    peak and the time of the first async save. Here a DTensor gets only its empty shard.
    """
    if isinstance(obj, DTensor):
        local = torch.empty(obj.to_local().shape, dtype=obj.dtype, pin_memory=pin)
        return DTensor.from_local(
            local,
            obj.device_mesh,
            obj.placements,
            run_check=False,
            shape=obj.shape,
            stride=obj.stride(),
        )
    if isinstance(obj, torch.Tensor):
        if not _is_plain(obj):
            return _create_cpu_state_dict({"t": obj}, pin_memory=pin)["t"]
        return torch.empty(obj.shape, dtype=obj.dtype, pin_memory=pin)
    if isinstance(obj, dict):
        return {key: _empty_like_on_cpu(value, pin) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        items = [_empty_like_on_cpu(value, pin) for value in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    return obj


def storage_key(tensor: torch.Tensor) -> int:
    """Identifies the memory a tensor lives in (0 for none): views of one storage agree."""
    local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor  # no autograd
    return local.untyped_storage().data_ptr()


@dataclass
class StagedState:
    """A staged state dict that is complete once ``deferred`` (CPU tensors, copied by the
    staging thread) and the device-to-host copies recorded by ``device_done`` are done."""

    state_dict: dict[str, Any]
    deferred: list[CopyPair] = field(default_factory=list)
    device_done: Any = None  # a torch.cuda.Event, when deferred CUDA tensors were queued

    @property
    def complete(self) -> bool:
        return not self.deferred and self.device_done is None


class _Filler:
    """One walk over the state and its cached buffers: copy now, or defer to a thread."""

    def __init__(self, defer: Callable[[torch.Tensor], bool]) -> None:
        self.defer = defer
        self.deferred: list[CopyPair] = []
        self.queued_on_device = False

    def fill(self, src: Any, dst: Any) -> Any:
        if isinstance(src, DTensor):
            self._copy(src.to_local(), dst.to_local())
            return dst
        if isinstance(src, torch.Tensor):
            if not _is_plain(src):
                return _copy_state_dict({"t": src}, {"t": dst}, type_check=False)["t"]
            self._copy(src, dst)
            return dst
        if isinstance(src, dict):
            return {key: self.fill(value, dst[key]) for key, value in src.items()}
        if isinstance(src, list | tuple):
            items = [self.fill(value, cached) for value, cached in zip(src, dst, strict=True)]
            return tuple(items) if isinstance(src, tuple) else items
        # Other leaves are not cached: an immutable one can be shared, others are copied
        # now (e.g. a data-loader position object the loop keeps updating).
        return src if isinstance(src, _IMMUTABLE) else copy.deepcopy(src)

    def _copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if not self.defer(src):
            dst.copy_(src)
        elif src.is_cuda and dst.is_pinned():
            # Device-to-host: queued now on the current stream, so it reads the values
            # before any later kernel on that stream (the optimizer's next step); it runs
            # on the copy engine while the loop goes on. Only the waiting is deferred.
            dst.copy_(src, non_blocking=True)
            self.queued_on_device = True
        else:
            self.deferred.append((src, dst))


class CpuCopy:
    """One CPU copy of a state dict whose buffers survive from one copy to the next: they
    are allocated by the first ``copy`` (or taken over by ``adopt``) and again only when
    the state's tensor layout changes. Not thread-safe: one copy at a time."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        self._layout: list[tuple[Any, ...]] | None = None
        self.copied: dict[str, Any] | None = None  # what the last copy() returned

    def adopt(self, copied: dict[str, Any]) -> None:
        """Use ``copied`` (a copy made by another CpuCopy, or loaded) as the buffers."""
        self._cache, self._layout, self.copied = copied, _layout(copied), copied

    def copy(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict`` copied into the buffers (the returned dict's tensors are them)."""
        layout = _layout(state_dict)
        if self._cache is None or layout != self._layout:
            self._cache = self.copied = None  # free the old buffers before allocating
            self._cache = _empty_like_on_cpu(state_dict, False)
            self._layout = layout
        with torch.no_grad():
            self.copied = _Filler(lambda _: False).fill(state_dict, self._cache)
        return self.copied

    def tensors(self) -> list[torch.Tensor]:
        """The buffers (tests: where the copies go)."""
        return _tensors(self._cache)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj.to_local() if isinstance(obj, DTensor) else obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, list | tuple):
        return [t for value in obj for t in _tensors(value)]
    return []


def copy_pairs(pairs: list[CopyPair]) -> None:
    """Run deferred copies (in the staging thread; grad mode is per thread)."""
    with torch.no_grad():
        for src, dst in pairs:
            dst.copy_(src)


class ReusableCpuStager:
    """Copies a state dict into CPU buffers that survive between saves."""

    def __init__(self, *, pin_memory: bool | None = None) -> None:
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._cache: dict[str, Any] | None = None
        self._layout: list[tuple[Any, ...]] | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._copying: Future[BaseException | None] | None = None  # the last deferred copy
        self._readers: list[Future[Any]] = []  # after_copy() jobs that read the cache

    def tensors(self) -> list[torch.Tensor]:
        """The staging buffers (tests: that a save reuses them)."""
        return _tensors(self._cache)

    def stage(
        self, state_dict: dict[str, Any], defer: Callable[[torch.Tensor], bool] | None = None
    ) -> StagedState:
        """Copy ``state_dict`` into the cache, except the tensors ``defer`` picks: those are
        listed in ``StagedState.deferred`` for start_deferred() (or copy_pairs) to copy later.
        Waits first for the reads of the previous staged copy (after_copy)."""
        readers, self._readers = self._readers, []
        for reader in readers:
            reader.exception()  # the reader's own caller reports its outcome
        self._copying = None
        layout = _layout(state_dict)
        if self._cache is None or layout != self._layout:
            self._cache = None  # free the old buffers before allocating new ones
            self._cache = _empty_like_on_cpu(state_dict, self._pin)
            self._layout = layout
        if self._thread is None:
            # One long-lived thread, started here (at prepare_staging, when there is one)
            # rather than on the first save: no thread start-up inside a save.
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="ddlaunch-staging")
            self._thread.submit(lambda: None)
        filler = _Filler(defer or (lambda _: False))
        with torch.no_grad():
            staged = filler.fill(state_dict, self._cache)
        device_done = None
        if filler.queued_on_device:
            device_done = torch.cuda.Event()
            device_done.record()  # on the current stream, after the queued copies
        return StagedState(staged, filler.deferred, device_done)

    def start_deferred(self, staged: StagedState) -> Future[BaseException | None]:
        """Copy ``staged.deferred`` in the background, then wait for its device-to-host
        copies. The future never raises: it holds the copy's exception, if any, so that
        the caller decides how to report it."""
        assert self._thread is not None, "stage() first"
        self._copying = self._thread.submit(_run_copies, staged)
        return self._copying

    def after_copy(self, staged: StagedState, read: Callable[[dict[str, Any]], Any]) -> Future[Any]:
        """``read(staged.state_dict)`` on the staging thread, once the staged copy is
        complete (the thread runs its jobs in order, after start_deferred's copy); the
        future raises the copy's error instead when that failed. The next stage() waits
        for it before overwriting the cache."""
        assert self._thread is not None, "stage() first"
        copying = self._copying

        def job() -> Any:
            error = copying.result() if copying is not None else None
            if error is not None:
                raise error
            return read(staged.state_dict)

        future = self._thread.submit(job)
        self._readers.append(future)
        return future

    def close(self) -> None:
        if self._thread is not None:
            # A copy still running holds its own references to the buffers.
            self._thread.shutdown(wait=False)
            self._thread = None
        self._cache = None
        self._layout = None


def _run_copies(staged: StagedState) -> BaseException | None:
    try:
        copy_pairs(staged.deferred)
        if staged.device_done is not None:
            staged.device_done.synchronize()
    except Exception as exc:
        return exc
    return None
