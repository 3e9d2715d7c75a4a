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


def quadratic_slow_nodes(busy: dict[str, float], factor: float) -> dict[str, float]:
    """The rule as it was written first: the median of the others, computed for each node."""
    import statistics

    out: dict[str, float] = {}
    if len(busy) < 2:
        return out
    for host, mine in busy.items():
        others = statistics.median(v for h, v in busy.items() if h != host)
        if others > 0 and mine > factor * others:
            out[host] = mine / others
    return out


def test_slow_nodes_gives_the_verdicts_of_the_quadratic_rule_on_random_inputs() -> None:
    import random

    rng = random.Random(1234)
    found = 0
    for case in range(2000):
        n = rng.randint(0, 40)
        # Few distinct values (ties, zeros) as well as continuous ones.
        if case % 2:
            busy = {f"h{i}": float(rng.choice([0, 0.1, 0.2, 0.5, 1.0])) for i in range(n)}
        else:
            busy = {f"h{i}": rng.lognormvariate(-2, 1) for i in range(n)}
        factor = rng.choice([1.0, 1.5, 2.0, 3.0])
        got = analysis.slow_nodes(busy, factor)
        assert got == quadratic_slow_nodes(busy, factor), (busy, factor)
        found += len(got)
    assert found > 500  # the inputs do contain stragglers


def test_slow_nodes_grows_no_faster_than_n_log_n() -> None:
    """200 -> 2,000 nodes: O(n log n) takes ~11x as long, O(n^2) 100x (0.29 s at 2,000
    nodes before). CPU time, best of 5 for each size (``support.timing``)."""
    import random

    from support.timing import cpu_seconds

    def best(n: int) -> float:
        rng = random.Random(n)
        busy = {f"n{i}": rng.uniform(0.09, 0.11) for i in range(n)}
        return cpu_seconds(lambda: analysis.slow_nodes(busy, 2.0))

    small, large = best(200), best(2000)
    print(f"slow_nodes: 200 nodes {small * 1e3:.2f} ms, 2000 nodes {large * 1e3:.2f} ms")
    assert large / small < 40, (small, large)
