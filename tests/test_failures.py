"""The failure shown first is the cause, not a peer that lost its connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddlaunch.store.failures import read_failures


def write(run: Path, rank: int, attempt: int, t: float, exc: str, msg: str) -> None:
    (run / "failures").mkdir(parents=True, exist_ok=True)
    (run / "failures" / f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "host": f"node{rank // 2 + 1}",
                "job_id": "5",
                "attempt": attempt,
                "time": t,
                "exception": exc,
                "message": msg,
                "where": "train.py:9",
            }
        )
    )


def test_cause_first_collateral_after(tmp_path: Path) -> None:
    # Recorded shape: rank 1 raised; rank 0's gloo call then failed (and was written later).
    gloo = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [10.77.0.11]:2445"
    )
    write(tmp_path, 0, 1, 100.5, "RuntimeError", gloo)
    write(tmp_path, 1, 1, 100.2, "RuntimeError", "deterministic failure at step 50")
    write(tmp_path, 3, 0, 50.0, "ValueError", "an older attempt")
    ranks = [(f.rank, f.attempt) for f in read_failures(tmp_path)]
    assert ranks == [(1, 1), (0, 1), (3, 0)]
    assert read_failures(tmp_path)[0].one_line() == (
        "rank 1 on node1: RuntimeError: deterministic failure at step 50 at train.py:9"
    )


def test_collateral_error_first_in_time_still_ranks_after_a_real_error(tmp_path: Path) -> None:
    write(tmp_path, 2, 0, 10.0, "RuntimeError", "Socket Timeout")
    write(tmp_path, 3, 0, 11.0, "torch.OutOfMemoryError", "CUDA out of memory")
    assert [f.rank for f in read_failures(tmp_path)] == [3, 2]


def test_a_failure_record_costs_no_fsync_and_other_records_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16,000 ranks write one at once when a collective fails: no fsync for them, while the
    # run's state (here an outcome) stays durable: the file, then its directory.
    import os

    from ddlaunch.store import failures, outcome

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    failures.write_failure(tmp_path, 3, {"rank": 3, "host": "node7", "exception": "RuntimeError"})
    found = failures.read_failure(tmp_path, 3)
    assert synced == [] and found is not None
    assert (found.rank, found.host, found.exception) == (3, "node7", "RuntimeError")
    assert [p.name for p in (tmp_path / "failures").iterdir()] == ["node-node7.jsonl"]
    outcome.write_outcome(tmp_path, "FAILED", "crash")
    assert len(synced) == 2


def test_a_nodes_ranks_share_one_file_and_each_ranks_newest_record_counts(
    tmp_path: Path,
) -> None:
    """One file per node (2,000 creates when every rank of 2,000 nodes x 8 fails, not 16,000);
    a rank that failed again (a later attempt) is read as its newest record, as when each
    rank overwrote its own file; earlier versions' rank files are read beside them."""
    from ddlaunch.store import failures

    def record(rank: int, attempt: int, t: float, msg: str, host: str = "node1") -> dict:
        return {"rank": rank, "host": host, "job_id": "5", "attempt": attempt, "time": t,
                "exception": "RuntimeError", "message": msg}  # fmt: skip

    for rank in range(8):
        failures.write_failure(tmp_path, rank, record(rank, 0, 10.0 + rank, f"first {rank}"))
    failures.write_failure(tmp_path, 3, record(3, 1, 50.0, "again"))
    failures.write_failure(tmp_path, 8, record(8, 1, 51.0, "other node", host="node2"))
    write(tmp_path, 9, 1, 52.0, "ValueError", "an earlier version's file")
    names = sorted(p.name for p in (tmp_path / "failures").iterdir())
    assert names == ["node-node1.jsonl", "node-node2.jsonl", "rank-9.json"]
    assert getattr(failures.read_failure(tmp_path, 3), "message", None) == "again"
    found = read_failures(tmp_path)
    assert [(f.rank, f.attempt) for f in found][:3] == [(3, 1), (8, 1), (9, 1)]
    assert sorted(f.rank for f in found) == list(range(10))


def test_a_torn_or_damaged_line_is_named_and_the_others_still_read(tmp_path: Path) -> None:
    from ddlaunch.store import failures

    failures.write_failure(tmp_path, 0, {"host": "node1", "exception": "E", "message": "ok"})
    with open(tmp_path / "failures" / "node-node1.jsonl", "a") as handle:
        handle.write('[1, 2]\n{"rank": 1, "host": "node1", "exc')  # a rank killed mid-write
    assert [f.rank for f in read_failures(tmp_path)] == [0]
    problems = [str(p) for p in failures.unusable_failures(tmp_path)]
    assert problems[0] == (
        "unreadable failures/node-node1.jsonl line 2: a list where an object is expected"
    )
    assert problems[1].startswith("unreadable failures/node-node1.jsonl line 3: not JSON")
    assert len(problems) == 2
