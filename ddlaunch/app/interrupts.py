"""SIGINT and SIGTERM on the login node: an exception anywhere, except inside the few
sections that must finish once started, where the signal waits for the section's end.

Such a section is an sbatch and the record of its job id: killed halfway, sbatch may have
queued a job whose id nobody knows (``subprocess.run`` kills its child when the caller is
interrupted; the terminal's Ctrl-C reaches the child directly unless it runs in its own
session, which ``SlurmClient.sbatch`` asks for). Bounded: every Slurm command has a timeout.

SIGTERM's default action ends the process without unwinding (no cleanup, no record), so
``install`` makes it raise like SIGINT does.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signame`` says which. A KeyboardInterrupt, so that every
    ``except KeyboardInterrupt`` and cleanup treats both alike."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def signal_name(exc: KeyboardInterrupt) -> str:
    """The signal behind an interrupt: SIGTERM or SIGINT (a plain KeyboardInterrupt)."""
    return exc.signame if isinstance(exc, Interrupted) else "SIGINT"


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def install() -> None:
    """SIGINT and SIGTERM raise ``Interrupted`` (main thread only, as Python requires)."""
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, _raise)


@contextmanager
def deferred() -> Iterator[list[str]]:
    """Inside the block SIGINT and SIGTERM are remembered (the list yielded holds their
    names); when the block ends normally, the first one is raised as ``Interrupted``. An
    exception leaving the block wins (the signal is then dropped: the caller is unwinding
    anyway). Outside the main thread signals never reach Python code: a no-op."""
    caught: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def remember(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not caught:
            os.write(2, f"[ddlaunch] {name}: stopping once the records are complete\n".encode())
        caught.append(name)

    previous = {number: signal.signal(number, remember) for number in SIGNALS}
    try:
        yield caught
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if caught:
        raise Interrupted(caught[0])
