"""``standbys.json``: the standby processes of ``fault_tolerance.restart: in_process``, for
``status``: how many wait on each node, and which were taken (became which rank).

One file per run, rewritten whole (temp name, fsync, rename) by the control store's holder
(the first node's standby, ``worker.standby``) when the set changes: a standby registered, one
took a rank, a node was lost with its standbys. Never one file per standby or per rank: at
2,000 nodes x 8 GPUs the books are one small file and one write per change, read with one open.
The record belongs to one attempt (``attempt``: its key); ``status`` shows it under that
attempt while it runs.

``Tally`` folds the holder's events into the record (pure). Torch-free, no Slurm calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.records import number, text, whole

STANDBYS_FILE = "standbys.json"
# The taken standbys the record lists, the latest; the earlier ones are counted
# (``taken_count``).
KEEP_TAKEN = 16


@dataclass(frozen=True)
class NodeStandbys:
    """One node's standbys: ``waiting`` not taken; ``spare``: a hot spare (no rank of its
    own); ``lost``: the node was lost with its standbys (its ranks moved to a spare)."""

    host: str
    waiting: int
    spare: bool = False
    lost: bool = False


@dataclass(frozen=True)
class TakenStandby:
    """A standby that took ``rank`` at in-process restart ``generation``: ``pid`` is the
    standby's (it stays and waits again), ``rank_pid`` the process that runs the rank."""

    rank: int
    host: str
    generation: int
    pid: int | None = None
    rank_pid: int | None = None


@dataclass(frozen=True)
class StandbyBook:
    """``standbys.json``: ``attempt`` the attempt's key (``AttemptId.key``), ``time`` when
    written; ``nodes`` one entry per node that had standbys, in the order they registered;
    ``taken`` the latest ``KEEP_TAKEN`` taken standbys, ``taken_count`` all of them."""

    attempt: str
    time: float
    nodes: tuple[NodeStandbys, ...] = ()
    taken: tuple[TakenStandby, ...] = ()
    taken_count: int = 0

    @property
    def waiting(self) -> int:
        return sum(n.waiting for n in self.nodes if not n.lost)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> StandbyBook | None:
        """The record as written; None when it is not one (a missing key, a wrong kind)."""
        attempt, when = text(data.get("attempt")), number(data.get("time"))
        nodes, taken = data.get("nodes"), data.get("taken")
        if attempt is None or when is None:
            return None
        if not isinstance(nodes, list | tuple) or not isinstance(taken, list | tuple):
            return None
        out_nodes = []
        for n in nodes:
            if not isinstance(n, dict):
                return None
            host, waiting = text(n.get("host")), whole(n.get("waiting"))
            if host is None or waiting is None:
                return None
            out_nodes.append(NodeStandbys(host, waiting, bool(n.get("spare")), bool(n.get("lost"))))
        out_taken = []
        for t in taken:
            if not isinstance(t, dict):
                return None
            rank, host, generation = (
                whole(t.get("rank")),
                text(t.get("host")),
                whole(t.get("generation")),
            )
            if rank is None or host is None or generation is None:
                return None
            pids = whole(t.get("pid")), whole(t.get("rank_pid"))
            out_taken.append(TakenStandby(rank, host, generation, *pids))
        count = whole(data.get("taken_count"))
        return cls(
            attempt,
            float(when),
            tuple(out_nodes),
            tuple(out_taken),
            len(out_taken) if count is None else count,
        )


def write(run_dir: Path, book: StandbyBook) -> None:
    """Crash-safe: a reader sees the previous record or this one, never a torn one."""
    fsutil.atomic_write_json(run_dir / STANDBYS_FILE, book.as_dict())


def read(run_dir: Path) -> StandbyBook | None:
    try:
        data = fsutil.read_json(run_dir / STANDBYS_FILE)
    except (OSError, ValueError):
        return None
    return StandbyBook.from_mapping(data) if isinstance(data, dict) else None


@dataclass
class Tally:
    """The holder's running count, fed one event at a time (``registered``, ``taken``,
    ``lost``); ``book`` is the record of it now."""

    attempt: str
    waiting: dict[str, int] = field(default_factory=dict)  # host -> not taken, in order
    spares: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    taken: list[TakenStandby] = field(default_factory=list)
    taken_count: int = 0

    def registered(self, host: str, spare: bool) -> None:
        self.waiting[host] = self.waiting.get(host, 0) + 1
        if spare:
            self.spares.add(host)
        else:
            self.spares.discard(host)  # a spare whose standby took a rank runs ranks now

    def took(self, t: TakenStandby) -> None:
        self.waiting[t.host] = max(0, self.waiting.get(t.host, 0) - 1)
        self.taken_count += 1
        self.taken = [*self.taken[-(KEEP_TAKEN - 1) :], t]

    def lost_host(self, host: str) -> None:
        self.lost.add(host)
        self.waiting[host] = 0

    def book(self, now: float) -> StandbyBook:
        nodes = tuple(
            NodeStandbys(h, n, h in self.spares, h in self.lost) for h, n in self.waiting.items()
        )
        return StandbyBook(self.attempt, now, nodes, tuple(self.taken), self.taken_count)


def hosts_by_count(book: StandbyBook) -> Sequence[tuple[int, bool, list[str]]]:
    """The nodes not lost grouped by (waiting, spare), in the order first seen:
    ``[(1, False, [node1, node2]), (2, True, [node3])]``."""
    groups: dict[tuple[int, bool], list[str]] = {}
    for n in book.nodes:
        if not n.lost:
            groups.setdefault((n.waiting, n.spare), []).append(n.host)
    return [(w, s, hosts) for (w, s), hosts in groups.items()]
