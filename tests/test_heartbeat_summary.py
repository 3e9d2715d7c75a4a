"""The heartbeat summary ``status`` shows (``health/watchdog.json``): a node the run left out
(an in-process restart moved its ranks to a spare) does not age the oldest beat."""

from __future__ import annotations

import json
from pathlib import Path

from support.fakes import FakeRunner
from support.samples import in_process_beats

from ddlaunch.job.watchdog import watch
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.beats import Beat, by_node
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import exclusions
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.heartbeats import node_heartbeat_path, write_node_record

NOW = 1_790_000_500.0
T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=5, straggler_factor=2.0, straggler_patience=30
)


def test_the_summary_leaves_out_the_nodes_the_run_left_out() -> None:
    beats = [Beat.from_record(r) for ranks in in_process_beats(NOW).values() for r in ranks]
    nodes = by_node(beats)
    counted = analysis.summary_of(nodes, NOW)
    assert counted["oldest_beat_age"] == 40.1  # every node counts: the dead one's beats too
    shown = analysis.summary_of(nodes, NOW, left_out=["node2"])
    assert shown["oldest_beat_age"] == 0.6
    assert shown["step"] == 261 and shown["running"] == 4
    assert shown["busy_per_node"] == {"node1": 0.15, "node3": 0.15}


def test_the_watchdog_summary_does_not_age_with_a_node_an_in_process_restart_left(
    tmp_path: Path,
) -> None:
    """The watchdog reads the run's exclusions (the in-process restart left node2 out, as
    every node failure is left out) and writes a summary every reader agrees on."""
    for host, ranks in in_process_beats(NOW).items():
        beat = max(r["beat"] for r in ranks)
        path = node_heartbeat_path(tmp_path, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_node_record(path, host, ("52", 0, 0), beat, ranks)
    exclusions.add_excluded(tmp_path, ["node2"], "node failure: every rank died (moved to a spare)")
    times = iter([NOW - 130, NOW])  # the watchdog started before the ranks
    finding = watch(
        tmp_path,
        attempt=AttemptId("52", 0, "52"),
        thresholds=T,
        expected_ranks=4,
        srun_pid=None,
        client=SlurmClient(FakeRunner()),
        clock=lambda: next(times),
        sleep=lambda s: None,
        max_polls=1,
        in_process=True,
    )
    assert finding is None
    summary = json.loads((tmp_path / "health" / "watchdog.json").read_text())
    assert summary["step"] == 261
    assert summary["oldest_beat_age"] < 1.0  # was 40.1: node2's last beats
