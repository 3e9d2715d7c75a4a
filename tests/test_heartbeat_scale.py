"""Heartbeats at the scale of a 2,000-node x 8-GPU job, written with the ranks' own writer:
one file per node on the shared filesystem per interval, a watchdog cycle well inside its
poll period, and the verdicts the per-rank layout of earlier versions gives."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support import beats as synth
from support.fakes import FakeRunner

from ddlaunch.job.watchdog import _Watch, watch
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import heartbeats as store
from ddlaunch.store.attempts import AttemptId

NODES, PER_NODE = 2000, 8
T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=10, straggler_factor=2.0, straggler_patience=30
)
ATTEMPT = AttemptId(synth.JOB, synth.RESTART, synth.JOB)


def one_interval(tmp_path: Path, scenario: str, now: float) -> tuple[Path, Path, int]:
    """(node layout run dir, per-rank layout run dir, files written to the shared
    filesystem in the node layout's interval)."""
    recs = synth.records(NODES, PER_NODE, now, scenario)
    node_run, rank_run = tmp_path / "node-layout", tmp_path / "rank-layout"
    writers = synth.writers(node_run, tmp_path / "node-tmp", recs, PER_NODE)
    shared = str(store.heartbeat_dir(node_run))
    written = 0
    real_replace = os.replace

    def counting_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        nonlocal written
        written += os.fspath(dst).startswith(shared)
        real_replace(src, dst)

    store.os.replace = counting_replace  # type: ignore[assignment]
    try:
        synth.beat_all(writers)
    finally:
        store.os.replace = real_replace
    synth.write_rank_layout(rank_run, recs)
    return node_run, rank_run, written


def verdicts(run_dir: Path, now: float) -> list[analysis.Finding | None]:
    """The findings of two polls, ``straggler_patience`` apart, on the same beats."""
    w = _Watch(run_dir, ATTEMPT, T, NODES * PER_NODE, SlurmClient(FakeRunner()), now - 10)
    beats = w.beats()
    assert len(beats) == NODES * PER_NODE
    return [w.analyse(now, beats), w.analyse(now + T.straggler_patience, beats)]


def cycle_seconds(run_dir: Path, now: float) -> float:
    """One whole watchdog cycle (read, summarise, analyse), best of 3."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        finding = watch(
            run_dir,
            attempt=ATTEMPT,
            thresholds=T,
            expected_ranks=NODES * PER_NODE,
            srun_pid=None,
            client=SlurmClient(FakeRunner()),
            clock=lambda: now,
            sleep=lambda s: None,
            max_polls=1,
        )
        times.append(time.perf_counter() - started)
        assert finding is None
    return min(times)


# alone: the watchdog's cycle is timed (writing 2,000 x 8 ranks' beats twice takes ~20 s on
# the 2-core VM, and loaded cores would slow the cycle).
@pytest.mark.alone
def test_a_healthy_attempt_at_scale_is_one_file_per_node_and_a_short_cycle(
    tmp_path: Path,
) -> None:
    now = time.time()
    node_run, rank_run, written = one_interval(tmp_path, synth.HEALTHY, now)
    assert written == NODES  # <= 2,004: one record per node per interval
    names = os.listdir(store.heartbeat_dir(node_run))
    assert len(names) == NODES and all(n.startswith("node-") for n in names)
    # The healthy cycle decided from the nodes' summaries: no node's ranks were decoded.
    w = _Watch(node_run, ATTEMPT, T, NODES * PER_NODE, SlurmClient(FakeRunner()), now - 10)
    beats = w.beats()
    assert w.analyse(now, beats) is None and beats.decoded == 0
    node_cycle, rank_cycle = cycle_seconds(node_run, now), cycle_seconds(rank_run, now)
    print(
        f"\nwatchdog cycle, {NODES} nodes x {PER_NODE} ranks: node layout "
        f"{node_cycle:.3f} s, per-rank layout {rank_cycle:.3f} s"
    )
    # Target 0.1 s on an idle machine; asserted with room for a shared, loaded one.
    assert node_cycle < 1.0
    assert verdicts(node_run, now) == verdicts(rank_run, now) == [None, None]


@pytest.mark.parametrize("scenario", [synth.HANG, synth.STRAGGLER])
def test_the_node_layout_gives_the_per_rank_layouts_verdicts_at_scale(
    tmp_path: Path, scenario: str
) -> None:
    now = time.time()
    node_run, rank_run, _ = one_interval(tmp_path, scenario, now)
    got = verdicts(node_run, now)
    assert got == verdicts(rank_run, now)
    if scenario == synth.HANG:
        finding = got[0]
        assert finding is not None and finding.cause == "hang"
        assert finding.nodes == (synth.host(synth.HANG_RANK // PER_NODE),)
        assert finding.ranks == (synth.HANG_RANK,)
        # Explained from the culprit's node's ranks alone.
        w = _Watch(node_run, ATTEMPT, T, NODES * PER_NODE, SlurmClient(FakeRunner()), now - 10)
        beats = w.beats()
        assert w.analyse(now, beats) == finding and beats.decoded == 1
    else:
        assert got[0] is None
        finding = got[1]
        assert finding is not None and finding.cause == "straggler"
        assert finding.nodes == (synth.host(synth.SLOW_NODE),)
