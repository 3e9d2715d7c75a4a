"""Heartbeat records: one file per node on the shared filesystem, one per rank on the node.

* ``health/heartbeat/node-<host>.jsonl`` (shared, in the run directory): the node's latest
  heartbeats, written by the node's leader rank (local rank 0) every
  ``health.heartbeat_interval``. Line 1 is the head, ``{"host", "job_id", "restart",
  "relaunch", "beat", "summary"}``: the attempt, when the ranks were merged, and the node's
  ``policy.beats.NodeSummary`` (what the watchdog decides a healthy node from); each further
  line is one rank's record exactly as that rank wrote it (step, time, step and busy time,
  where it is stuck, whether it waits in a collective), so blame and the hang analysis see
  each rank as before. The watchdog decodes the head of every node a cycle and a node's
  rank lines only when its summary makes it a suspect: at 2,000 nodes x 8 ranks a cycle
  decodes 2,000 small heads instead of 16,000 rank records.
* ``<node tmp>/ddlaunch-beats-<key>-<attempt>/rank-<R>.json`` (node-local: /dev/shm or $TMPDIR, one
  directory per run, host and attempt): each rank's own latest record, which its leader merges.
* ``health/heartbeat/node-<host>.json`` (one JSON object with a ``ranks`` list) and
  ``health/heartbeat/rank-<R>.json``: the layouts of earlier versions, still read.

Why a file per node rather than a network transport (the ranks sending beats to the batch
host over TCP): the run directory is already the one place every process of the job can
reach, it outlives any of them (the end hook and ``status`` read the last beats after the
ranks are gone), and a dead writer is plain to see (its file stops changing) without a
server whose own failure would look like every node dying. What made files expensive was
their count, not files as such: 2,000 nodes x 8 ranks beating every 10 s were 1,600 creates
and renames a second on a metadata server, and a watchdog cycle opened 16,000 files (16 s at
1 ms an open on Lustre). One record per node divides both by the ranks per node, and the
ranks' own writes go to node-local memory, which costs nothing.

Every write goes to a temp name and is renamed, so a reader never sees a torn record; none is
fsynced (a lost heartbeat is harmless: the next one replaces it; an fsync per node every
interval would be a storm on the metadata server for nothing). Written by the ranks
(``ddlaunch.worker.heartbeat``), read by the watchdog and the end hook.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from ddlaunch.policy.beats import (
    Beat,
    NodeSummary,
    current_beats,
    same_attempt,
    summarise,
)

HEARTBEAT_DIR = ("health", "heartbeat")
NODE_PREFIX = "node-"
NODE_SUFFIX = ".jsonl"
RANK_PREFIX = "rank-"
LOCAL_PREFIX = "ddlaunch-beats-"
MERGE_LOCK = ".merge.lock"


class RankBeat(TypedDict):
    """One rank's heartbeat record, as the rank writes it (``worker.heartbeat``) and as its
    node record keeps it, line for line. Read back as found: only its being an object is
    checked (``policy.beats.Beat.from_record`` reads the fields the analysis needs, one of
    the wrong kind as absent)."""

    rank: int
    leader: bool
    host: str
    pid: int
    job_id: str
    restart: int
    relaunch: int
    started: float
    state: str  # running, closed
    step: int | None
    step_wall: float | None  # when the step finished
    step_time: float | None  # seconds a step, over the last window
    busy_time: float | None  # of it, the time not spent waiting for peers
    beat: float
    where: NotRequired[str]  # where the main thread is, when it has not stepped for a while
    waiting: NotRequired[bool]  # whether that is inside a collective


class NodeHead(TypedDict):
    """Line 1 of a node record (see the module's doc)."""

    host: str
    job_id: str
    restart: int
    relaunch: int
    beat: float  # when the leader merged the ranks' records
    summary: dict[str, object]  # ``policy.beats.NodeSummary.to_json``


def heartbeat_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir).joinpath(*HEARTBEAT_DIR)


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The per-rank file of earlier versions (``rank-<R>.json``), still read."""
    return heartbeat_dir(run_dir) / f"{RANK_PREFIX}{rank}.json"


def node_heartbeat_path(run_dir: str | os.PathLike[str], host: str) -> Path:
    """The node's record in the run directory (``node-<host>.jsonl``)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "_"
    return heartbeat_dir(run_dir) / f"{NODE_PREFIX}{safe}{NODE_SUFFIX}"


def local_beats_dir(
    node_tmp: str | os.PathLike[str],
    run_dir: str | os.PathLike[str],
    host: str,
    job_id: str,
    restart: int,
    relaunch: int,
) -> Path:
    """The node-local directory of one attempt's ranks on one host: keyed by the run
    directory, the host and the attempt, so two runs (or two attempts) never merge each
    other's beats, nor two nodes that share a /dev/shm (a dev cluster's nodes in network
    namespaces of one machine)."""
    attempt = "".join(c if c.isalnum() else "_" for c in f"{job_id}-{restart}-{relaunch}")
    return Path(node_tmp) / f"{_local_prefix(run_dir, host)}{attempt}"


def earlier_local_dirs(
    node_tmp: str | os.PathLike[str], run_dir: str | os.PathLike[str], host: str, current: Path
) -> list[Path]:
    """This run's node-local directories on this host of other attempts: the attempts of a
    run follow each other, so these are over (one whose ranks were killed stays behind)."""
    prefix = _local_prefix(run_dir, host)
    try:
        names = os.listdir(node_tmp)
    except OSError:
        return []
    return [Path(node_tmp) / n for n in names if n.startswith(prefix) and n != current.name]


def _local_prefix(run_dir: str | os.PathLike[str], host: str) -> str:
    import hashlib  # here, not at the top: the login node imports this module too

    key = f"{os.path.abspath(run_dir)}\0{host}"
    return f"{LOCAL_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:16]}-"


def local_rank_path(local_dir: Path, rank: int) -> Path:
    return local_dir / f"{RANK_PREFIX}{rank}.json"


def write_heartbeat(path: Path, record: RankBeat) -> None:
    """Write one rank's record by rename."""
    _write(path, json.dumps(record))


def _write(path: Path, data: str) -> None:
    """By rename. The directory must exist (the writer makes it once, not on every beat: a
    ``mkdir`` that fails with EEXIST is a metadata call like any other); if it was removed
    under a live writer, it is made again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(data)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(data)
    os.replace(tmp, path)


def read_local_beats(local_dir: Path) -> list[RankBeat]:
    """The node's ranks' own records (unreadable or half-written files are skipped)."""
    return [cast(RankBeat, r) for r in _read_records(local_dir, _names(local_dir), RANK_PREFIX)]


def write_node_record(
    path: Path,
    host: str,
    attempt: tuple[str, int, int],
    beat: float,
    ranks: Iterable[RankBeat],
) -> None:
    """One node's record: the head with the node's summary, then its ranks' records in rank
    order, one a line. ``attempt``: (job id, restart, relaunch)."""
    job_id, restart, relaunch = attempt
    ordered = sorted(ranks, key=lambda r: int(r.get("rank", -1)))
    summary = summarise(host, [Beat.from_record(r) for r in ordered])
    head: NodeHead = {
        "host": host,
        "job_id": job_id,
        "restart": restart,
        "relaunch": relaunch,
        "beat": beat,
        "summary": summary.to_json(),
    }
    lines = [json.dumps(head, separators=(",", ":"))]
    lines += [json.dumps(r, separators=(",", ":")) for r in ordered]
    _write(path, "\n".join(lines) + "\n")


@dataclass
class NodeFile:
    """One node record as read: its head decoded, its rank lines decoded only when asked."""

    head: dict[str, object]  # as found (a ``NodeHead`` from this version)
    rest: bytes

    @classmethod
    def parse(cls, data: bytes) -> NodeFile | None:
        first, _, rest = data.partition(b"\n")
        try:
            head = json.loads(first.decode())  # str: json.loads of bytes guesses the encoding
        except ValueError:
            return None
        return cls(head, rest) if isinstance(head, dict) else None

    @property
    def host(self) -> str:
        return str(self.head.get("host", "?"))

    def summary(self) -> NodeSummary | None:
        data = self.head.get("summary")
        return NodeSummary.from_json(data) if isinstance(data, dict) else None

    def ranks(self) -> list[RankBeat]:
        out: list[RankBeat] = []
        for line in self.rest.splitlines():
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(cast(RankBeat, rec))
        return out


def _names(directory: Path) -> list[str]:
    """The directory's entries, listed once per read (a directory of 2,000 nodes' records
    is one lock on a metadata server)."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def read_node_files(directory: Path, names: Iterable[str]) -> list[NodeFile]:
    """The node records among ``names`` (heads decoded; unreadable files skipped)."""
    out = []
    base = os.fspath(directory)  # joined as strings: 2,000 Path objects a cycle cost more
    for name in names:
        if not (name.startswith(NODE_PREFIX) and name.endswith(NODE_SUFFIX)):
            continue
        try:
            with open(os.path.join(base, name), "rb") as handle:
                node = NodeFile.parse(handle.read())
        except OSError:
            continue
        if node is not None:
            out.append(node)
    return out


def read_heartbeats(run_dir: str | os.PathLike[str]) -> list[RankBeat]:
    """Every rank's latest heartbeat record: the ranks of each node's record, and those of
    the layouts of earlier versions. Unreadable or half-written files are skipped."""
    directory = heartbeat_dir(run_dir)
    names = _names(directory)
    records = [r for node in read_node_files(directory, names) for r in node.ranks()]
    return records + _earlier_layouts(directory, names)


def _earlier_layouts(directory: Path, names: list[str]) -> list[RankBeat]:
    """The rank records of ``node-<host>.json`` (one JSON object, its ranks in a list) and
    of ``rank-<R>.json`` files."""
    records: list[RankBeat] = []
    for rec in _read_records(directory, names, NODE_PREFIX):
        ranks = rec.get("ranks")
        if isinstance(ranks, list):
            records.extend(cast(RankBeat, r) for r in ranks if isinstance(r, dict))
    records.extend(cast(RankBeat, r) for r in _read_records(directory, names, RANK_PREFIX))
    return records


@dataclass
class AttemptBeats:
    """One attempt's heartbeats as the watchdog reads them: a summary per node, and each
    node's rank records on demand (decoded for a suspect node only; ``decoded`` counts the
    nodes that were)."""

    attempt: tuple[str, int, int]  # job id, restart, relaunch
    not_before: float
    nodes: list[NodeSummary] = field(default_factory=list)
    files: dict[str, NodeFile] = field(default_factory=dict)  # host -> not decoded yet
    beats: dict[str, list[Beat]] = field(default_factory=dict)  # host -> decoded
    decoded: int = 0

    def __len__(self) -> int:
        """The ranks heard from (every state)."""
        return sum(n.ranks for n in self.nodes)

    def ranks_of(self, hosts: Iterable[str]) -> list[Beat]:
        """The beats of these nodes' ranks, in rank order."""
        out: list[Beat] = []
        for host in set(hosts):
            if host in self.files:
                self.beats[host] = self.decode(self.files.pop(host))
                self.decoded += 1
            out.extend(self.beats.get(host, ()))
        return sorted(out, key=lambda b: b.rank)

    def all(self) -> list[Beat]:
        return self.ranks_of([n.host for n in self.nodes])

    def decode(self, node: NodeFile) -> list[Beat]:
        job_id, restart, relaunch = self.attempt
        return current_beats(node.ranks(), job_id, restart, self.not_before, relaunch)


def read_attempt(
    run_dir: str | os.PathLike[str],
    job_id: str,
    restart: int,
    not_before: float = 0.0,
    relaunch: int = 0,
) -> AttemptBeats:
    """This attempt's beats: the node records whose head names the attempt, and the rank
    records of earlier layouts (``policy.beats.current_beats`` filters both the same way).
    A node whose summary is missing (another version), or whose ranks may not all pass the
    filter (one started before ``not_before``), or that is heard from twice, is summarised
    from its ranks here."""
    view = AttemptBeats((job_id, restart, relaunch), not_before)
    directory = heartbeat_dir(run_dir)
    names = _names(directory)
    older: dict[str, list[Beat]] = {}
    for b in current_beats(
        _earlier_layouts(directory, names), job_id, restart, not_before, relaunch
    ):
        older.setdefault(b.host, []).append(b)
    for node in read_node_files(directory, names):
        if not same_attempt(node.head, job_id, restart, relaunch):
            continue
        host = node.host
        summary = node.summary()
        fresh = host not in older and host not in view.files
        if fresh and summary is not None and summary.first_started >= not_before:
            view.nodes.append(summary)
            view.files[host] = node
            continue
        beats = older.setdefault(host, [])
        if host in view.files:  # heard from twice: summarised from both records' ranks
            beats.extend(view.decode(view.files.pop(host)))
        beats.extend(view.decode(node))
    if older:
        view.nodes = [n for n in view.nodes if n.host in view.files]
        for host, beats in older.items():
            if beats:
                view.nodes.append(summarise(host, beats))
                view.beats[host] = beats
    view.nodes.sort(key=lambda n: n.host)
    return view


def _read_records(directory: Path, names: Iterable[str], prefix: str) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        try:
            with open(directory / name, encoding="utf-8") as handle:
                rec = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def last_node_beat(run_dir: str | os.PathLike[str], hosts: Sequence[str]) -> float | None:
    """The newest merge time (``beat``) of these nodes' records; None without any."""
    beats = []
    for host in hosts:
        try:
            with open(node_heartbeat_path(run_dir, host), "rb") as handle:
                node = NodeFile.parse(handle.readline())
        except OSError:
            continue
        beat = None if node is None else node.head.get("beat")
        if isinstance(beat, (int, float)):
            beats.append(float(beat))
    return max(beats) if beats else None
