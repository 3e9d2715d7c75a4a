"""Retrying a Slurm call while the controller does not answer (a restart, a failover).

Only ``SlurmUnreachable`` is retried: a refusal (an invalid job id, a job that may not be
requeued) is an answer, and asking again would not change it. The waits grow 1, 2, 4, 8,
16 s and then stay at 30 s, until ``patience_s`` is spent. What happened is kept in
``Retries`` for the attempt record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ddlaunch.slurm.client import SlurmUnreachable

T = TypeVar("T")
MAX_WAIT_S = 30.0


@dataclass
class Retries:
    """Every call made through one ``Retrier``: how many, how long they took in all (the
    failed calls' own time included), the errors."""

    tries: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def record(self) -> dict[str, object]:
        # The last few errors say enough; a long outage would otherwise bloat the record.
        return {
            "tries": self.tries,
            "elapsed_s": round(self.elapsed_s, 1),
            "errors": self.errors[-3:],
        }


class Retrier:
    def __init__(
        self,
        patience_s: float,
        *,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.patience_s = patience_s
        self.sleep, self.clock = sleep or time.sleep, clock or time.monotonic
        self.retries = Retries()
        self._start: float | None = None

    def __call__(self, action: Callable[[], T], what: str = "") -> T:
        """``action()``, retried while Slurm is unreachable and patience lasts (shared by
        every call of this retrier: one deadline for the whole conversation)."""
        if self._start is None:
            self._start = self.clock()
        start = self._start
        wait = 1.0
        while True:
            self.retries.tries += 1
            try:
                return action()
            except SlurmUnreachable as exc:
                self.retries.errors.append(str(exc))
                self.retries.elapsed_s = self.clock() - start
                left = self.patience_s - self.retries.elapsed_s
                if left <= 0:
                    raise
                pause = min(wait, left, MAX_WAIT_S)
                print(
                    f"[ddlaunch] Slurm unreachable{f' ({what})' if what else ''}: {exc.detail}; "
                    f"retrying in {pause:.0f} s",
                    flush=True,
                )
                self.sleep(pause)
                wait *= 2
            finally:
                self.retries.elapsed_s = self.clock() - start
