"""A run directory's ranks through the local runner (real rank processes, gloo on 127.0.0.1,
CPU): ``run_local`` started in a thread, a stop signal sent to chosen ranks while they train
(the example scripts print ``step N`` on rank 0, and ``trainer_scripts/example_with_pid.py``
leaves each rank's pid), and the check that it ended with every rank stopped."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ddlaunch.launch.local import LocalRunError, run_local

# Bounds the whole run (start, steps, the save on the signal); run_local kills the ranks after
# it. Where the ranks save on a signal without agreeing on the step, they deadlock (until
# this), or gloo aborts (exit 134).
TIMEOUT_S = 60.0


def tails(run: Path) -> str:
    parts = []
    for log in sorted((run / "logs").glob("rank-*")):
        lines = log.read_text(errors="replace").splitlines()[-8:]
        parts.append(f"--- {log.name}\n" + "\n".join(lines))
    return "\n".join(parts)


def start(run: Path, world_size: int, timeout_s: float = TIMEOUT_S) -> tuple:
    """run_local in a thread: (the thread, the list its result or exception goes to)."""
    outcome: list[object] = []

    def launch() -> None:
        try:
            outcome.append(run_local(run, world_size=world_size, timeout_s=timeout_s))
        except BaseException as exc:  # reported by finished()
            outcome.append(exc)

    thread = threading.Thread(target=launch, daemon=True)
    thread.start()
    return thread, outcome


def finished(
    run: Path, thread: threading.Thread, outcome: list[object], timeout_s: float = TIMEOUT_S
) -> None:
    thread.join(timeout_s + 15)  # run_local's own timeout kills the ranks before this
    assert outcome, "run_local did not return (the ranks were not stopped)"
    if isinstance(outcome[0], LocalRunError):
        pytest.fail(
            f"the ranks did not stop together ({outcome[0]}): a hang until the timeout, or "
            f"a collective mismatch\n{tails(run)}"
        )
    assert not isinstance(outcome[0], BaseException), outcome[0]


def logged_step(run: Path) -> int:
    """The last step rank 0 logged (the example prints ``step N`` on rank 0)."""
    try:
        lines = (run / "logs" / "rank-0.out").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    return max(steps, default=0)


def signal_while_training(
    run: Path,
    run_thread: tuple,
    delays: dict[int, float],
    signum: int,
    past_step: int,
    timeout_s: float = TIMEOUT_S,
) -> int:
    """Once rank 0 has logged ``past_step`` (training under way on every rank: a DDP step
    needs them all, so the trainer's handler is in), send ``signum`` to each rank in
    ``delays`` that many seconds apart; the step rank 0 had logged when it began."""
    thread, outcome = run_thread
    started = time.monotonic()
    while logged_step(run) < past_step and thread.is_alive():
        assert time.monotonic() - started < timeout_s, "training never started:\n" + tails(run)
        time.sleep(0.05)
    assert thread.is_alive(), f"the run ended before the signal: {outcome}\n{tails(run)}"
    signalled_at = logged_step(run)
    pids = {r: int((run / "out" / f"pid-{r}").read_text()) for r in delays}
    sent = time.monotonic()
    for rank, delay in sorted(delays.items(), key=lambda item: item[1]):
        time.sleep(max(0.0, sent + delay - time.monotonic()))
        os.kill(pids[rank], signum)
    return signalled_at
