"""A run directory's ranks through the local runner (real rank processes, gloo on 127.0.0.1,
CPU): ``run_local`` started in a thread, so that a test can signal the ranks while they train,
and the check that it ended with every rank stopped."""

from __future__ import annotations

import threading
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
