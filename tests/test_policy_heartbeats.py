"""Heartbeat analysis (pure): hangs, their culprits, stragglers."""

from __future__ import annotations

from ddlaunch.policy import heartbeats as analysis

T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=5, straggler_factor=2.0, straggler_patience=30
)


def beat(rank, host, step, step_wall, beat_t, **kw) -> analysis.Beat:
    return analysis.Beat(rank=rank, host=host, step=step, step_wall=step_wall, beat=beat_t, **kw)


def test_no_hang_within_timeout() -> None:
    beats = [beat(0, "a", 10, 1000.0, 1040.0), beat(1, "b", 10, 1000.0, 1040.0)]
    assert analysis.detect_hang(beats, 1050.0, T) is None


def test_hang_blames_the_rank_outside_any_collective() -> None:
    beats = [
        beat(0, "a", 40, 1000.0, 1099.0, waiting=True, where="torch/autograd/__init__.py:1"),
        beat(1, "a", 40, 1000.0, 1099.0, waiting=True),
        beat(2, "b", 40, 1000.0, 1099.0, waiting=False, where="train.py:12 in step"),
        beat(3, "b", 40, 1000.0, 1099.0, waiting=True),
    ]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.cause == "hang"
    assert finding.nodes == ("b",) and finding.ranks == (2,)
    assert "train.py:12" in finding.detail


def test_hang_blames_a_frozen_process_first() -> None:
    beats = [
        beat(0, "a", 40, 1000.0, 1099.0, waiting=True),
        beat(1, "b", 40, 1000.0, 1010.0),  # its writer thread stopped 90 s ago: SIGSTOP
    ]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == ("b",)
    assert "frozen" in finding.detail


def test_hang_blames_ranks_behind_the_others() -> None:
    beats = [beat(0, "a", 41, 1000.0, 1099.0), beat(1, "b", 40, 990.0, 1099.0)]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == ("b",)


def test_hang_without_a_culprit_blames_nobody() -> None:
    beats = [beat(r, h, 40, 1000.0, 1099.0, waiting=True) for r, h in enumerate("aabb")]
    finding = analysis.detect_hang(beats, 1100.0, T)
    assert finding is not None and finding.nodes == () and "no single node" in finding.detail


def test_closed_ranks_are_not_hung() -> None:
    beats = [beat(0, "a", 100, 1000.0, 1001.0, state="closed")]
    assert analysis.detect_hang(beats, 5000.0, T) is None


def test_straggler_needs_patience() -> None:
    def beats_at() -> list[analysis.Beat]:
        return [
            beat(0, "a", 5, 999.0, 999.0, busy_time=0.10),
            beat(1, "b", 5, 999.0, 999.0, busy_time=0.11),
            beat(2, "c", 5, 999.0, 999.0, busy_time=0.35),
        ]

    state = analysis.StragglerState()
    assert analysis.detect_straggler(beats_at(), 1000.0, T, state) is None
    assert state.slow_since == {"c": 1000.0}
    finding = analysis.detect_straggler(beats_at(), 1031.0, T, state)
    assert finding is not None and finding.cause == "straggler" and finding.nodes == ("c",)
    assert "3.3x" in finding.detail
    # Back to normal: forgotten.
    fast = [beat(r, h, 6, 1040.0, 1040.0, busy_time=0.1) for r, h in enumerate("abc")]
    assert analysis.detect_straggler(fast, 1040.0, T, state) is None and not state.slow_since


def test_current_beats_ignore_other_attempts() -> None:
    recs = [
        {"rank": 0, "host": "a", "job_id": "7", "restart": 1, "beat": 1.0},
        {"rank": 1, "host": "a", "job_id": "7", "restart": 0, "beat": 1.0},
    ]
    assert [b.rank for b in analysis.current_beats(recs, "7", 1)] == [0]
