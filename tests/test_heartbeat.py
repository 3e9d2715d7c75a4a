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
