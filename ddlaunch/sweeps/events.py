"""What ``sweep submit`` and ``sweep resubmit`` say as they go, as typed values (beside the
shared ones in ``app.events``), and the progress display they drive without knowing it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ddlaunch.sweeps.prepare import ArrayJob, Tick
from ddlaunch.sweeps.submit import ArrayOutcome


class Phases(Protocol):
    """A progress display, one line per phase (the CLI's: a rich bar on a terminal)."""

    def phase(self, description: str, total: int) -> Tick | None: ...


Progress = Callable[[], AbstractContextManager[Phases]]


class _Silent:
    def phase(self, description: str, total: int) -> Tick | None:
        return None


@contextmanager
def no_progress() -> Iterator[Phases]:
    """No display (a caller without a terminal)."""
    yield _Silent()


@dataclass(frozen=True)
class SweepDryRun:
    """What would be submitted: header lines, then each array's script and sbatch line."""

    header: tuple[str, ...]
    arrays: tuple[ArrayJob, ...]


@dataclass(frozen=True)
class Heading:
    """The line that says what is submitted (before sbatch on resubmit, after it on submit),
    and the sweep directory when it is new."""

    line: str
    sweep_dir: Path | None = None


@dataclass(frozen=True)
class Note:
    """A line for the terminal about one member (a COMPLETED member that runs again)."""

    line: str


@dataclass(frozen=True)
class NothingToResubmit:
    """No member was in the states asked for (``which``: "failed", "cancelled" or both)."""

    which: str


@dataclass(frozen=True)
class ArraysSubmitted:
    """Each array's sbatch outcome; the members of a refused one were not submitted."""

    outcomes: tuple[ArrayOutcome, ...]
    sweep_dir: Path
