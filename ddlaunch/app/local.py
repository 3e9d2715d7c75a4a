"""The one local-run path (``submit --local``, ``resume --local``): the ranks of a run
directory run on this machine, and the run's outcome is recorded. Returns what the CLI
prints; prints nothing itself."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.config.schema import Config
from ddlaunch.config.validate import parse_duration
from ddlaunch.policy.requeue import COMPLETED, FAILED
from ddlaunch.store.outcome import write_outcome
from ddlaunch.store.progress import read_result


@dataclass(frozen=True)
class LocalRun:
    results: list[dict[str, Any]]  # per rank, by rank
    seconds: float
    summary: dict[str, Any] | None  # result.json, when the training code wrote one

    def summary_line(self) -> str | None:
        if not self.summary:
            return None
        items = (f"{k}={v}" for k, v in self.summary.items() if not isinstance(v, dict | list))
        return "result: " + ", ".join(items)


def run_locally(run_dir: Path, cfg: Config) -> LocalRun:
    """Run every rank of ``run_dir`` here (within ``job.time``); the outcome is recorded
    either way (``LocalRunError`` names the failing rank)."""
    from ddlaunch.launch.local import LocalRunError, run_local  # imports submitit

    timeout_s = float(parse_duration(cfg.job.time) or 24 * 3600)
    started = time.time()
    try:
        results = run_local(run_dir, cfg.world_size, timeout_s)
    except LocalRunError as exc:
        write_outcome(run_dir, FAILED, str(exc))
        raise
    seconds = round(time.time() - started, 2)
    write_outcome(run_dir, COMPLETED, seconds=seconds)
    return LocalRun(results, seconds, read_result(run_dir))
