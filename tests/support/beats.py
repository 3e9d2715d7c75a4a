"""Synthetic heartbeats at scale, written with the ranks' own writer (``Heartbeat``): a
healthy attempt, a hang with one culprit, a straggler node; in the node layout (one record
per node, each node with its own node-local directory) or the per-rank layout of earlier
versions."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddlaunch.store.heartbeats import heartbeat_path, write_heartbeat
from ddlaunch.worker.heartbeat import Heartbeat

JOB, RESTART = "4242", 0
HEALTHY, HANG, STRAGGLER = "healthy", "hang", "straggler"
HANG_RANK, SLOW_NODE = 13, 7


class SyntheticBeat(Heartbeat):
    """A rank's writer whose record is given instead of measured."""

    record: dict[str, Any]

    def snapshot(self) -> dict[str, Any]:
        return dict(self.record)


def host(node: int) -> str:
    return f"n{node:04d}"


def records(
    nodes: int, per_node: int, now: float, scenario: str = HEALTHY, seed: int = 0
) -> list[dict[str, Any]]:
    """One record per rank, ranks ``node * per_node + local``; busy times jitter by seed."""
    rng = random.Random(seed)
    out = []
    for node in range(nodes):
        for local in range(per_node):
            rank = node * per_node + local
            busy = 0.1 + rng.uniform(-0.01, 0.01)
            rec: dict[str, Any] = {
                "rank": rank,
                "leader": local == 0,
                "host": host(node),
                "pid": 1000 + rank,
                "job_id": JOB,
                "restart": RESTART,
                "relaunch": 0,
                "started": now - 30,
                "state": "running",
                "step": 500,
                "step_wall": now - 1,
                "step_time": 0.3,
                "busy_time": busy,
                "beat": now - 0.5,
            }
            if scenario == STRAGGLER and node == SLOW_NODE:
                rec["busy_time"] = 0.3
            if scenario == HANG:
                rec["step_wall"] = now - 400
                rec["where"] = "torch/distributed/distributed_c10d.py:1 in all_reduce"
                rec["waiting"] = True
                if rank == HANG_RANK:
                    rec.update(step=499, where="train.py:9 in load_batch", waiting=False)
            out.append(rec)
    return out


def writers(
    run_dir: Path, node_tmp: Path, recs: Iterable[dict[str, Any]], per_node: int
) -> list[SyntheticBeat]:
    """One prepared writer per rank, each node's leader last (it merges what its ranks
    wrote); every node has its own node-local directory under ``node_tmp``."""
    out = []
    for rec in recs:
        hb = SyntheticBeat(
            run_dir,
            rec["rank"],
            host=rec["host"],
            job_id=JOB,
            restart=RESTART,
            local_rank=rec["rank"] % per_node,
            local_dir=node_tmp / rec["host"],
        )
        hb.record = rec
        hb.prepare()
        out.append(hb)
    return sorted(out, key=lambda hb: (hb.host, hb.leader))


def beat_all(beats: list[SyntheticBeat]) -> None:
    """One interval: every rank writes once (the leaders merge)."""
    for hb in beats:
        hb.write()


def write_rank_layout(run_dir: Path, recs: Iterable[dict[str, Any]]) -> None:
    """The per-rank layout of earlier versions: ``health/heartbeat/rank-<R>.json``."""
    for rec in recs:
        path = heartbeat_path(run_dir, rec["rank"])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_heartbeat(path, rec)
