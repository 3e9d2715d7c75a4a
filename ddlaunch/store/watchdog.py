"""The watchdog's records under ``health/``:

* ``health/verdict-<job>-<restart>.json``: its finding for an attempt (cause, blamed nodes,
  ranks, detail), read by the end hook;
* ``health/watchdog.json``: a heartbeat summary for ``status``, rewritten every poll;
* ``health/steps.jsonl``: one sample per poll in which the step advanced, the throughput
  history ``ddlaunch report`` draws.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.records import INT, NUMBER

HEALTH_DIR = "health"
SUMMARY_FILE = "watchdog.json"
STEPS_FILE = "steps.jsonl"
# What readers of the summary rely on (``store.records.clean``).
SUMMARY_FIELDS = {"time": NUMBER, "oldest_beat_age": NUMBER, "step": INT}


def verdict_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / f"verdict-{attempt.key}.json"


def read_verdict(run_dir: Path, attempt: AttemptId) -> dict[str, Any] | None:
    try:
        return fsutil.read_json(verdict_path(run_dir, attempt))
    except (OSError, ValueError):
        return None


def write_verdict(run_dir: Path, attempt: AttemptId, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(verdict_path(run_dir, attempt), record, 0o600)


def summary_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / SUMMARY_FILE


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """No fsync: a summary for ``status``, rewritten every poll."""
    path = summary_path(run_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, path)
    except OSError:
        pass


def steps_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / STEPS_FILE


# The nodes a sample keeps by name: the slowest (a straggler's history); the others are
# summed up in the median. A line per poll stays a few hundred bytes at 2,000 nodes
# (all of them by name: ~40 KB a poll, ~29 MB an hour).
SLOWEST_KEPT = 8


def sample_busy(busy: dict[str, float]) -> dict[str, Any]:
    """The nodes' busy times as a sample keeps them: the ``SLOWEST_KEPT`` slowest by name,
    the median and the count of all."""
    if not busy:
        return {}
    times = sorted(busy.values())
    middle = len(times) // 2
    median = times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
    slowest = sorted(busy.items(), key=lambda item: (-item[1], item[0]))[:SLOWEST_KEPT]
    return {"slowest": dict(slowest), "median": round(median, 4), "nodes": len(busy)}


def append_sample(run_dir: Path, summary: dict[str, Any]) -> None:
    """One line per poll in which the step advanced (time, step, attempt, the slowest nodes'
    busy time and the median). At most one line per poll period (a few seconds), appended
    without fsync; its size does not grow with the nodes."""
    line = {
        "time": round(summary["time"], 2),
        "step": summary["step"],
        "job_id": summary.get("job_id"),
        "restart": summary.get("restart"),
        "relaunch": summary.get("relaunch", 0),
        "busy": sample_busy(summary.get("busy_per_node") or {}),
    }
    try:
        with open(steps_path(run_dir), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    except OSError:
        pass


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    samples = []
    try:
        lines = steps_path(run_dir).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            sample = json.loads(line)
        except ValueError:
            continue
        if isinstance(sample, dict):
            samples.append(sample)
    return samples
