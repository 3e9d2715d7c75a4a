"""The step ``status`` shows for a running attempt (``app.status_step.current_step``), from rank 0's
progress and the watchdog's summary of the heartbeats: it never goes back without a restart,
and after an in-process restart it is never behind the step the ranks resumed from.

The watchdog's summary is stamped with its poll's time, but its steps are the node records'
as their leaders last merged them (up to two heartbeat intervals before): the summaries here
are made by the watchdog's own ``summary_of`` from node records that lag the ranks."""

from __future__ import annotations

from pathlib import Path

from ddlaunch.app.runs import RunInfo
from ddlaunch.app.status_step import current_step
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.beats import Beat, by_node
from ddlaunch.store.attempts import AttemptRecord
from ddlaunch.store.progress import Progress
from ddlaunch.store.watchdog import Summary

T0 = 1_790_000_000.0
INTERVAL = 10.0  # health.heartbeat_interval's default


def lagging_summary(poll: float, step: int, merged: float) -> Summary:
    """``health/watchdog.json`` as the watchdog writes it at ``poll``, from two nodes'
    records (two ranks each) last merged at ``merged``, when every rank had reached
    ``step``."""
    beats = [
        Beat(
            rank=r,
            host=f"node{r // 2 + 1}",
            step=step,
            step_wall=merged - 0.2,
            beat=merged,
            busy_time=0.15,
            step_time=0.19,
            started=T0 + 1,
        )
        for r in range(4)
    ]
    fields = analysis.summary_of(by_node(beats), poll)
    return Summary.from_json({**fields, "job_id": "52", "restart": 0, "relaunch": 0})


def running(
    progress: tuple[int, float],
    summary: Summary,
    restarts: list[dict[str, object]] | None = None,
    checkpoint: int | None = None,
) -> RunInfo:
    attempt: dict[str, object] = {"attempt": 0, "job_id": "52", "nodes": "node[1-2]"}
    attempt |= {"start": T0, "in_process_restarts": restarts or []}
    step, when = progress
    return RunInfo(
        path=Path("/runs/r"),
        run_id="r",
        job_ids=["52"],
        attempts=[AttemptRecord.from_json(attempt)],
        progress=Progress.from_json({"step": step, "time": when}),
        watchdog=summary,
        latest_step=checkpoint,
    )


def in_process(generation: int, when: float, resumed_from: int, state_from: str) -> dict:
    """One in-process restart as the ranks record it: rank 3 on node2 crashed at ``when``."""
    return {
        "time": when, "generation": generation, "ranks": [3], "hosts": ["node2"],
        "cause": "crash", "replacements": [{"rank": 3, "host": "node2", "pid": 4242}],
        "rejoined_s": 0.4, "resumed_from": resumed_from, "state_from": state_from,
        "fell_back": None,
    }  # fmt: skip


def test_the_step_does_not_go_back_when_the_watchdog_polls_after_rank_0_reported() -> None:
    # Rank 0 reported step 129 at T0+50; the node records were last merged at T0+45 (127).
    # The watchdog polls at T0+48, then again at T0+52: its poll is newer than the progress,
    # its step is not.
    polls = [
        running((129, T0 + 50), lagging_summary(T0 + 48, 127, merged=T0 + 45)),
        running((129, T0 + 50), lagging_summary(T0 + 52, 127, merged=T0 + 45)),
        running((129, T0 + 50), lagging_summary(T0 + 56, 131, merged=T0 + 55)),
        running((133, T0 + 57), lagging_summary(T0 + 58, 131, merged=T0 + 55)),
    ]
    assert [current_step(info) for info in polls] == [129, 129, 131, 133]


def test_after_an_in_process_restart_from_ram_the_step_is_at_least_the_restored_one() -> None:
    # Checkpoint 40 on disk; the ranks reached step 60, rank 3 crashed at T0+100 and the
    # ranks resumed from step 55 from RAM. The node records the watchdog still reads were
    # merged at T0+95, when the ranks were at 43 (steps of 0.1 s, a 10 s interval).
    restart = [in_process(1, T0 + 100, 55, "ram")]
    stale = lagging_summary(T0 + 101, 43, merged=T0 + 100 - INTERVAL + 5)
    # Just after the restart: rank 0's progress is from before the failure.
    info = running((58, T0 + 97), stale, restart, checkpoint=40)
    assert current_step(info) == 55
    # Rank 0 reported the restarted generation's first step; the watchdog polled after it.
    stale = lagging_summary(T0 + 104, 43, merged=T0 + 95)
    info = running((56, T0 + 103), stale, restart, checkpoint=40)
    assert current_step(info) == 56
    # The node records caught up with the new generation.
    info = running((56, T0 + 103), lagging_summary(T0 + 112, 140, T0 + 111), restart, 40)
    assert current_step(info) == 140


def test_a_later_in_process_restart_from_disk_counts_from_where_it_resumed() -> None:
    # Restored from RAM at 55, then the ranks reached 70 and a second restart read the
    # checkpoint on disk (step 40): the run is at 41 now, not at the first restart's 55.
    restarts = [in_process(1, T0 + 100, 55, "ram"), in_process(2, T0 + 200, 40, "disk")]
    summary = lagging_summary(T0 + 204, 68, merged=T0 + 195)  # before the second failure
    info = running((41, T0 + 203), summary, restarts, checkpoint=40)
    assert current_step(info) == 41
