"""Preflight records under ``health/``:

* ``health/preflight/<job>-<restart>/<host>.json``: each node's report (facts, checks,
  bandwidth), written by the node itself as soon as it has them;
* ``health/spares/<job>-<restart>/<host>.json``: the same of each hot spare, checked beside
  the training step (local checks only: a spare is in no step yet);
* ``health/preflight.json``: the latest verdicts (for ``status`` and ``report``);
* ``health/gate-<job>-<restart>.json``: the in-rank gate's decision for one attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from ddlaunch import fsutil
from ddlaunch.policy.preflight import AttemptVerdict, NodeReport, VerdictRecord
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId, update_open
from ddlaunch.store.records import BOOL, INT, NUMBER, OBJECTS, STRINGS, TEXT

HEALTH_DIR = "health"
REPORTS_DIR = "preflight"
SPARES_DIR = "spares"
LATEST_FILE = "preflight.json"
# What readers of the latest verdicts and of a gate record rely on; ``LatestVerdicts`` and
# ``Gate`` have an attribute for each.
LATEST_FIELDS = {"job_id": TEXT, "nodes": STRINGS, "verdicts": OBJECTS, "decision": TEXT}
GATE_FIELDS = {
    "job_id": TEXT,
    "restart": INT,
    "passed": BOOL,
    "reason": TEXT,
    "time": NUMBER,
    "pid": INT,
    "printed": BOOL,  # the verdicts are in the batch log
}


@dataclass(frozen=True, kw_only=True)
class LatestVerdicts(records.Record):
    """``health/preflight.json``: the latest attempt's verdicts, one per node (``policy.
    preflight``'s records), and the decision made of them."""

    FIELDS: ClassVar[records.Fields] = LATEST_FIELDS
    NAME: ClassVar[str] = f"{HEALTH_DIR}/{LATEST_FILE}"

    job_id: str | None = None
    nodes: tuple[str, ...] | None = None
    verdicts: tuple[Mapping[str, Any], ...] | None = None
    decision: str | None = None


@dataclass(frozen=True, kw_only=True)
class Gate(records.Record):
    """``health/gate-<attempt>.json``: the in-rank gate's decision for one attempt."""

    FIELDS: ClassVar[records.Fields] = GATE_FIELDS
    NAME: ClassVar[str] = "gate"

    job_id: str | None = None
    restart: int | None = None
    passed: bool | None = None
    reason: str | None = None
    time: float | None = None
    pid: int | None = None
    printed: bool | None = None


def reports_dir(run_dir: Path, attempt: AttemptId, spare: bool = False) -> Path:
    return run_dir / HEALTH_DIR / (SPARES_DIR if spare else REPORTS_DIR) / attempt.key


def write_report(
    run_dir: Path, attempt: AttemptId, host: str, report: NodeReport, spare: bool = False
) -> None:
    fsutil.atomic_write_json(reports_dir(run_dir, attempt, spare) / f"{host}.json", report)


def read_reports(run_dir: Path, attempt: AttemptId, spare: bool = False) -> dict[str, NodeReport]:
    """Host -> report (``spare``: the hot spares'), as the node wrote it; unreadable
    (half-written) ones skipped."""
    reports: dict[str, NodeReport] = {}
    for path in sorted(reports_dir(run_dir, attempt, spare).glob("*.json")):
        try:
            reports[path.stem] = cast(NodeReport, fsutil.read_json(path) or {})
        except (OSError, ValueError):
            continue
    return reports


def latest_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / LATEST_FILE


def write_latest(run_dir: Path, record: LatestVerdicts) -> None:
    fsutil.atomic_write_json(latest_path(run_dir), record.to_json(), 0o600)


def record_verdicts(
    run_dir: Path,
    attempt: AttemptId,
    nodes: list[str],
    verdicts: list[VerdictRecord],
    per_node: list[AttemptVerdict],
    decision: str,
) -> None:
    """The latest verdicts (``verdicts``, for ``status`` and ``report``) and the open
    attempt's own short form of them (``per_node``: node, ok, reason)."""
    latest = LatestVerdicts(
        job_id=attempt.job_id, nodes=tuple(nodes), verdicts=tuple(verdicts), decision=decision
    )
    write_latest(run_dir, latest)
    update_open(run_dir, preflight=per_node)


def gate_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / f"gate-{attempt.key}.json"


def read_gate(run_dir: Path, attempt: AttemptId) -> Gate | None:
    """The attempt's gate record; None when there is none or it cannot be used (a gate
    still being written)."""
    found, _ = records.load_json(gate_path(run_dir, attempt), dict)
    return None if found is None else Gate.from_json(found)


def write_gate(run_dir: Path, attempt: AttemptId, record: Gate) -> None:
    fsutil.atomic_write_json(gate_path(run_dir, attempt), record.to_json(), 0o600)


def mark_printed(run_dir: Path, attempt: AttemptId, record: Gate) -> None:
    """The verdicts are in the batch log now (by the watchdog or the end hook): once only."""
    write_gate(run_dir, attempt, record.updated(printed=True))
