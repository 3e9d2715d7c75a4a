"""Heartbeat records: one file per node on the shared filesystem, one per rank on the node.

* ``health/heartbeat/node-<host>.json`` (shared, in the run directory): the node's latest
  heartbeats, ``{"host", "job_id", "restart", "relaunch", "beat", "ranks": [<rank record>,
  ...]}``, written by the node's leader rank (local rank 0) every ``health.heartbeat_interval``.
  Each rank record is exactly what that rank wrote (step, time, step and busy time, where it
  is stuck, whether it waits in a collective), so the watchdog sees each rank as before.
* ``<node tmp>/ddlaunch-beats-<key>-<attempt>/rank-<R>.json`` (node-local: /dev/shm or $TMPDIR, one
  directory per run, host and attempt): each rank's own latest record, which its leader merges.
* ``health/heartbeat/rank-<R>.json``: the per-rank layout of earlier versions, still read.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = ("health", "heartbeat")
NODE_PREFIX = "node-"
RANK_PREFIX = "rank-"
LOCAL_PREFIX = "ddlaunch-beats-"
MERGE_LOCK = ".merge.lock"


def heartbeat_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir).joinpath(*HEARTBEAT_DIR)


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The per-rank file of earlier versions (``rank-<R>.json``), still read."""
    return heartbeat_dir(run_dir) / f"{RANK_PREFIX}{rank}.json"


def node_heartbeat_path(run_dir: str | os.PathLike[str], host: str) -> Path:
    """The node's record in the run directory (``node-<host>.json``)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "_"
    return heartbeat_dir(run_dir) / f"{NODE_PREFIX}{safe}.json"


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


def write_heartbeat(path: Path, record: dict[str, Any]) -> None:
    """Write one record by rename. The directory must exist (the writer makes it once, not on
    every beat: a ``mkdir`` that fails with EEXIST is a metadata call like any other); if it
    was removed under a live writer, it is made again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = json.dumps(record)
    try:
        tmp.write_text(data)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(data)
    os.replace(tmp, path)


def read_local_beats(local_dir: Path) -> list[dict[str, Any]]:
    """The node's ranks' own records (unreadable or half-written files are skipped)."""
    return _read_records(local_dir, RANK_PREFIX)


def node_record(
    host: str, job_id: str, restart: int, relaunch: int, beat: float, ranks: list[dict[str, Any]]
) -> dict[str, Any]:
    """One node's record: its ranks' records, in rank order, and when they were merged."""
    return {
        "host": host,
        "job_id": job_id,
        "restart": restart,
        "relaunch": relaunch,
        "beat": beat,
        "ranks": sorted(ranks, key=lambda r: int(r.get("rank", -1))),
    }


def read_heartbeats(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's latest heartbeat record: the ranks of each node's record, and the files of
    the per-rank layout (a run started by an earlier version). Unreadable or half-written
    files are skipped."""
    directory = heartbeat_dir(run_dir)
    records: list[dict[str, Any]] = []
    for rec in _read_records(directory, NODE_PREFIX):
        ranks = rec.get("ranks")
        if isinstance(ranks, list):
            records.extend(r for r in ranks if isinstance(r, dict))
    records.extend(_read_records(directory, RANK_PREFIX))
    return records


def _read_records(directory: Path, prefix: str) -> list[dict[str, Any]]:
    records = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
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
            with open(node_heartbeat_path(run_dir, host), encoding="utf-8") as handle:
                rec = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("beat"), (int, float)):
            beats.append(float(rec["beat"]))
    return max(beats) if beats else None
