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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.records import INT, INTS, NUMBER, OBJECT, STRINGS, TEXT

HEALTH_DIR = "health"
SUMMARY_FILE = "watchdog.json"
STEPS_FILE = "steps.jsonl"
# What readers of the summary and of a verdict rely on (``store.records.clean``); ``Summary``
# and ``Verdict`` have an attribute for each.
SUMMARY_FIELDS = {
    "time": NUMBER,
    "oldest_beat_age": NUMBER,  # of the running ranks' beats, when the summary was made
    "step": INT,
    "ranks": INT,
    "running": INT,
    "busy_per_node": OBJECT,  # host -> seconds each step spent outside the collectives
    "job_id": TEXT,
    "restart": INT,
    "relaunch": INT,
}
SAMPLE_FIELDS = {
    "time": NUMBER,
    "step": INT,
    "job_id": TEXT,
    "restart": INT,
    "relaunch": INT,
    "busy": OBJECT,  # the slowest nodes by name, the median and count of all (sample_busy)
}
VERDICT_FIELDS = {
    "cause": TEXT,
    "nodes": STRINGS,
    "ranks": INTS,
    "detail": TEXT,
    "time": NUMBER,
    "job_id": TEXT,
    "restart": INT,
}


@dataclass(frozen=True, kw_only=True)
class Summary(records.Record):
    """``health/watchdog.json``: the heartbeats as the watchdog saw them at ``time``."""

    FIELDS: ClassVar[records.Fields] = SUMMARY_FIELDS
    NAME: ClassVar[str] = f"{HEALTH_DIR}/{SUMMARY_FILE}"

    time: float | None = None
    oldest_beat_age: float | None = None
    step: int | None = None
    ranks: int | None = None
    running: int | None = None
    busy_per_node: Mapping[str, Any] | None = None
    job_id: str | None = None
    restart: int | None = None
    relaunch: int | None = None


@dataclass(frozen=True, kw_only=True)
class Sample(records.Record):
    """One line of ``health/steps.jsonl``: the step at ``time`` in one attempt."""

    FIELDS: ClassVar[records.Fields] = SAMPLE_FIELDS
    NAME: ClassVar[str] = f"{HEALTH_DIR}/{STEPS_FILE}"

    time: float | None = None
    step: int | None = None
    job_id: str | None = None
    restart: int | None = None
    relaunch: int | None = None
    busy: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict(records.Record):
    """``health/verdict-<attempt>.json``: why the watchdog ended an attempt (``cause``:
    hang, straggler, node failure) and whom it blames."""

    FIELDS: ClassVar[records.Fields] = VERDICT_FIELDS
    NAME: ClassVar[str] = "verdict"

    cause: str | None = None
    nodes: tuple[str, ...] | None = None
    ranks: tuple[int, ...] | None = None
    detail: str | None = None
    time: float | None = None
    job_id: str | None = None
    restart: int | None = None


def verdict_name(key: str) -> str:
    """The verdict's file name for the attempt ``key`` (``AttemptId.key``)."""
    return f"verdict-{key}.json"


def verdict_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / verdict_name(attempt.key)


def read_verdict(run_dir: Path, attempt: AttemptId) -> Verdict | None:
    """The attempt's verdict; None when there is none or it cannot be used."""
    found, _ = records.load_json(verdict_path(run_dir, attempt), dict)
    return Verdict.from_json(found) if found else None


def write_verdict(run_dir: Path, attempt: AttemptId, record: Verdict) -> None:
    fsutil.atomic_write_json(verdict_path(run_dir, attempt), record.to_json(), 0o600)


def summary_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / SUMMARY_FILE


def write_summary(run_dir: Path, summary: Summary) -> None:
    """No fsync: a summary for ``status``, rewritten every poll."""
    path = summary_path(run_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(summary.to_json()))
        os.replace(tmp, path)
    except OSError:
        pass


def steps_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / STEPS_FILE


# The nodes a sample keeps by name: the slowest (a straggler's history); the others are
# summed up in the median. A line per poll stays a few hundred bytes at 2,000 nodes
# (all of them by name: ~40 KB a poll, ~29 MB an hour).
SLOWEST_KEPT = 8


def sample_busy(busy: Mapping[str, float]) -> dict[str, object]:
    """The nodes' busy times as a sample keeps them: the ``SLOWEST_KEPT`` slowest by name,
    the median and the count of all."""
    if not busy:
        return {}
    times = sorted(busy.values())
    middle = len(times) // 2
    median = times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
    slowest = sorted(busy.items(), key=lambda item: (-item[1], item[0]))[:SLOWEST_KEPT]
    return {"slowest": dict(slowest), "median": round(median, 4), "nodes": len(busy)}


def append_sample(run_dir: Path, summary: Summary) -> None:
    """One line per poll in which the step advanced (time, step, attempt, the slowest nodes'
    busy time and the median). At most one line per poll period (a few seconds), appended
    without fsync; its size does not grow with the nodes."""
    # from_json: a job id or restart not known is recorded as null
    line = Sample.from_json(
        {
            "time": round(summary.time or 0.0, 2),
            "step": summary.step,
            "job_id": summary.job_id,
            "restart": summary.restart,
            "relaunch": summary.relaunch or 0,
            "busy": sample_busy(summary.busy_per_node or {}),
        }
    )
    try:
        with open(steps_path(run_dir), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line.to_json()) + "\n")
    except OSError:
        pass


def read_samples(run_dir: Path) -> list[Sample]:
    """Every sample that can be read (a line cut short by a crash is skipped); a field of
    the wrong kind is dropped."""
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
            samples.append(Sample.from_json(sample))
    return samples
