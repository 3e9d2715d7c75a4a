"""Per-rank heartbeats: what the writer records, and where a stuck main thread is."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from ddlaunch.store.heartbeats import read_heartbeats
from ddlaunch.worker.heartbeat import Heartbeat, describe_stack


def test_heartbeat_records_step_time_and_busy_time(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path, 3, interval=60, host="h1", job_id="9", restart=2)
    hb.step(1)
    time.sleep(0.02)
    hb.step(2, wait_s=0.01)
    hb.write()
    (rec,) = read_heartbeats(tmp_path)
    assert (rec["rank"], rec["host"], rec["job_id"], rec["restart"], rec["step"]) == (
        3,
        "h1",
        "9",
        2,
        2,
    )
    assert rec["step_time"] >= 0.02 and rec["busy_time"] == pytest.approx(
        rec["step_time"] - 0.01, abs=1e-6
    )
    assert "where" not in rec  # stepping recently: no stack captured
    hb.stop("closed")
    assert read_heartbeats(tmp_path)[0]["state"] == "closed"
    assert list(tmp_path.joinpath("health", "heartbeat").iterdir()) == [hb.path]


def test_describe_stack_tells_waiting_from_stuck() -> None:
    frames: dict[str, object] = {}
    ready = threading.Event()

    def stuck() -> None:
        frames["stuck"] = sys._getframe()
        ready.set()
        time.sleep(0.2)

    t = threading.Thread(target=stuck)
    t.start()
    ready.wait()
    where, waiting = describe_stack(frames["stuck"])
    t.join()
    assert where.endswith("in stuck") and waiting is False


def node_of_two(run_dir: Path, node_tmp: Path) -> tuple[Heartbeat, Heartbeat]:
    """Ranks 4 (the leader, local rank 0) and 5 of one node, with their node-local directory."""
    kw = {"interval": 60, "host": "n1", "job_id": "9", "restart": 0, "local_dir": node_tmp}
    leader = Heartbeat(run_dir, 4, local_rank=0, **kw)  # type: ignore[arg-type]
    other = Heartbeat(run_dir, 5, local_rank=1, **kw)  # type: ignore[arg-type]
    for hb in (other, leader):
        hb.prepare()
    return leader, other


def test_a_node_writes_one_record_with_each_ranks_fields(tmp_path: Path) -> None:
    leader, other = node_of_two(tmp_path / "run", tmp_path / "shm")
    other.step(7)
    leader.step(7)
    other.write()  # node-local only
    assert not (tmp_path / "run" / "health" / "heartbeat").exists() or not list(
        (tmp_path / "run" / "health" / "heartbeat").iterdir()
    )
    leader.write()  # merges its node's records
    shared = list((tmp_path / "run" / "health" / "heartbeat").iterdir())
    assert [p.name for p in shared] == ["node-n1.jsonl"]
    recs = sorted(read_heartbeats(tmp_path / "run"), key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["step"], r["state"]) for r in recs] == [
        (4, "n1", 7, "running"),
        (5, "n1", 7, "running"),
    ]
    assert {"where", "waiting"}.isdisjoint(recs[1])  # stepping: no stack captured


def test_a_rank_that_stops_after_its_leader_still_reaches_the_shared_record(
    tmp_path: Path,
) -> None:
    leader, other = node_of_two(tmp_path / "run", tmp_path / "shm")
    leader.write()
    other.write()
    leader.stop("closed")
    other.stop("failed")
    states = {r["rank"]: r["state"] for r in read_heartbeats(tmp_path / "run")}
    assert states == {4: "closed", 5: "failed"}
    assert not leader.local_dir.exists()  # the last rank to stop removed it


def test_a_dead_leader_leaves_every_rank_of_its_node_stale(tmp_path: Path) -> None:
    """The leader is gone (never writes again): its node's record stops changing, so every
    rank of the node keeps its old beat, however often the others write locally."""
    leader, other = node_of_two(tmp_path / "run", tmp_path / "shm")
    other.write()
    leader.write()
    before = {r["rank"]: r["beat"] for r in read_heartbeats(tmp_path / "run")}
    time.sleep(0.01)
    other.write()  # alive, but nobody merges it any more
    assert {r["rank"]: r["beat"] for r in read_heartbeats(tmp_path / "run")} == before


def test_the_per_rank_layout_of_a_run_started_earlier_is_still_read(tmp_path: Path) -> None:
    old = tmp_path / "run" / "health" / "heartbeat"
    old.mkdir(parents=True)
    (old / "rank-3.json").write_text('{"rank": 3, "host": "a", "pid": 11}')
    leader, _ = node_of_two(tmp_path / "run", tmp_path / "shm")
    leader.write()
    assert sorted(r["rank"] for r in read_heartbeats(tmp_path / "run")) == [3, 4]
    # A rank of the new version removes its own file of the old layout when it starts.
    Heartbeat(tmp_path / "run", 3, host="a", local_rank=0, local_dir=tmp_path / "s2").prepare()
    assert not (old / "rank-3.json").exists()


def test_beats_make_no_directory_after_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, other = node_of_two(tmp_path / "run", tmp_path / "shm")
    made: list[Path] = []
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: object, **kw: object) -> None:
        made.append(self)
        real_mkdir(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", mkdir)
    for _ in range(3):
        other.write()
        leader.write()
    assert made == []


def test_the_leader_removes_its_nodes_directories_of_earlier_attempts(tmp_path: Path) -> None:
    """Ranks killed in attempt 0 (no stop, no cleanup) left their node-local directory; the
    leader of attempt 1 removes it, and leaves another run's directory alone."""
    shm = tmp_path / "shm"
    killed = Heartbeat(tmp_path / "run", 0, host="n1", job_id="9", restart=0, local_dir=shm)
    killed.prepare()
    killed.write()
    other_run = Heartbeat(tmp_path / "run2", 0, host="n1", job_id="9", restart=0, local_dir=shm)
    other_run.prepare()
    other_run.write()
    Heartbeat(tmp_path / "run", 0, host="n1", job_id="9", restart=1, local_dir=shm).prepare()
    left = sorted(p.name for p in shm.iterdir())
    assert len(left) == 2 and killed.local_dir.name not in left
    assert other_run.local_dir.name in left
