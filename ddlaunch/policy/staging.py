"""Data staging decisions and their words (pure): what a node must copy, the preflight check a
node's staging becomes, and the one-line summaries ``status`` and the batch log show.

The parts of data staging (``storage.stage``), by where they run (this is their index):
``config.staging`` (the rules), ``planning.staging`` (where a data set lands on a node),
``worker.stage_node``, ``worker.stage`` and ``worker.broadcast`` (the copy, by each node's
leader rank, before the first step), ``store.staging`` and ``store.stage_manifest`` (the
records), this module (the decisions and their words). The CPU copy of an asynchronous save
is another thing (``saving.cpu_copy``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ddlaunch.policy.preflight import Check, CheckStatus
from ddlaunch.wording import counted

Files = Mapping[str, tuple[int, int]]  # relative path -> (size, mtime_ns)


@dataclass(frozen=True)
class Sync:
    copy: tuple[str, ...]  # new or changed files, largest first (the threads finish together)
    delete: tuple[str, ...]  # files the source no longer has
    bytes: int  # what copying costs

    @property
    def empty(self) -> bool:
        return not self.copy and not self.delete


def diff(source: Files, present: Files) -> Sync:
    """What turns ``present`` (a node's partial copy) into ``source``: a file counts as copied
    when its size and modification time (set from the source after the copy) match."""
    copy = [rel for rel, meta in source.items() if present.get(rel) != meta]
    copy.sort(key=lambda rel: -source[rel][0])
    delete = sorted(rel for rel in present if rel not in source)
    return Sync(tuple(copy), tuple(delete), sum(source[rel][0] for rel in copy))


def size_text(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def item_text(item: Mapping[str, Any]) -> str:
    """``train: copied 2.1 GB (10000 files) in 3.2 s`` / ``train: up to date (0 B)``."""
    name, state = item.get("name", "?"), item.get("state", "?")
    if state == "failed":
        return f"{name}: failed: {item.get('error', '')}"
    took = f" in {item['seconds']:.1f} s" if item.get("seconds") is not None else ""
    if state == "up to date":
        return f"{name}: up to date, 0 B copied{took}"
    return (
        f"{name}: copied {size_text(item.get('bytes', 0))} "
        f"({counted(item.get('files', 0), 'file')}) "
        f"of {size_text(item.get('total_bytes', 0))}{took}"
    )


def source_failure(item: Mapping[str, Any]) -> bool:
    """A failed data set whose error is about its source (missing, unreadable, a directory
    for sbcast), not its node-local copy: the source is one path every node reads, so it
    fails alike everywhere unless one node's view of it differs (a missing mount)."""
    error, src, dst = str(item.get("error", "")), str(item.get("src", "")), item.get("dst")
    return bool(src) and src in error and not (dst and str(dst) in error)


def check(items: Sequence[Mapping[str, Any]]) -> Check:
    """A node's staging as a preflight check: a failed data set fails the node (a full or
    broken local disk is excluded like any other); a failure of the source carries its
    ``cause``, so that a source that fails on every node stops the run and blames no node
    (``policy.preflight.decide``)."""
    failed = [i for i in items if i.get("state") == "failed"]
    text = "; ".join(item_text(i) for i in items)
    cause = ""
    if failed and all(source_failure(i) for i in failed):
        cause = "; ".join(item_text(i) for i in failed)
    return Check("staging", CheckStatus.FAIL if failed else CheckStatus.OK, text, cause)


class NodeStaging(Protocol):
    """What the words below read of one node's staging record (``store.staging``'s, which
    this pure layer does not import)."""

    @property
    def state(self) -> str | None: ...
    @property
    def start(self) -> float | None: ...
    @property
    def end(self) -> float | None: ...
    @property
    def items(self) -> Sequence[Mapping[str, Any]] | None: ...  # one per data set
    @property
    def progress(self) -> Mapping[str, Any] | None: ...  # bytes done "of" bytes to copy


def node_line(host: str, record: NodeStaging) -> str:
    """One node's staging for ``status``: ``node1 staging 40% of 2.1 GB`` while it runs."""
    state = record.state
    if state == "running":
        progress = record.progress or {}
        done, total = progress.get("bytes", 0), progress.get("of", 0)
        share = f" {100 * done / total:.0f}% of {size_text(total)}" if total else ""
        return f"{host} staging{share}"
    items = record.items or ()
    if state == "failed":
        failed = [i for i in items if i.get("state") == "failed"]
        return f"{host} staging failed ({item_text(failed[0]) if failed else '?'})"
    copied = sum(int(i.get("bytes", 0)) for i in items)
    seconds = (record.end or 0) - (record.start or 0)
    if not copied:
        return f"{host} data up to date"
    return f"{host} staged {size_text(copied)} in {seconds:.1f} s"


def summary(records: Mapping[str, NodeStaging]) -> str:
    """Every node of an attempt, one clause each: ``staging: node1 staged 2.1 GB in 3.2 s,
    node2 data up to date``."""
    if not records:
        return ""
    return "staging: " + ", ".join(node_line(h, r) for h, r in sorted(records.items()))
