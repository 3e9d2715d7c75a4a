"""Preflight records under ``health/``:

* ``health/preflight/<job>-<restart>/<host>.json``: each node's report (facts, checks,
  bandwidth), written by the node itself as soon as it has them;
* ``health/spares/<job>-<restart>/<host>.json``: the same of each hot spare, checked beside
  the training step (local checks only: a spare is in no step yet);
* ``health/preflight.json``: the latest verdicts (for ``status`` and ``report``);
* ``health/gate-<job>-<restart>.json``: the in-rank gate's decision for one attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.attempts import AttemptId, update_open

HEALTH_DIR = "health"
REPORTS_DIR = "preflight"
SPARES_DIR = "spares"
LATEST_FILE = "preflight.json"
LATEST_FIELDS = {"verdicts": records.OBJECTS}  # what readers of the latest verdicts rely on


def reports_dir(run_dir: Path, attempt: AttemptId, spare: bool = False) -> Path:
    return run_dir / HEALTH_DIR / (SPARES_DIR if spare else REPORTS_DIR) / attempt.key


def write_report(
    run_dir: Path, attempt: AttemptId, host: str, report: dict[str, Any], spare: bool = False
) -> None:
    fsutil.atomic_write_json(reports_dir(run_dir, attempt, spare) / f"{host}.json", report)


def read_reports(
    run_dir: Path, attempt: AttemptId, spare: bool = False
) -> dict[str, dict[str, Any]]:
    """Host -> report (``spare``: the hot spares'); unreadable (half-written) ones skipped."""
    reports: dict[str, dict[str, Any]] = {}
    for path in sorted(reports_dir(run_dir, attempt, spare).glob("*.json")):
        try:
            reports[path.stem] = fsutil.read_json(path) or {}
        except (OSError, ValueError):
            continue
    return reports


def latest_path(run_dir: Path) -> Path:
    return run_dir / HEALTH_DIR / LATEST_FILE


def write_latest(run_dir: Path, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(latest_path(run_dir), record, 0o600)


def record_verdicts(
    run_dir: Path,
    attempt: AttemptId,
    nodes: list[str],
    verdicts: list[dict[str, Any]],
    per_node: list[dict[str, Any]],
    decision: str,
) -> None:
    """The latest verdicts (``verdicts``, for ``status`` and ``report``) and the open
    attempt's own short form of them (``per_node``: node, ok, reason)."""
    write_latest(
        run_dir,
        {"job_id": attempt.job_id, "nodes": nodes, "verdicts": verdicts, "decision": decision},
    )
    update_open(run_dir, preflight=per_node)


def gate_path(run_dir: Path, attempt: AttemptId) -> Path:
    return run_dir / HEALTH_DIR / f"gate-{attempt.key}.json"


def read_gate(run_dir: Path, attempt: AttemptId) -> dict[str, Any] | None:
    try:
        return fsutil.read_json(gate_path(run_dir, attempt))
    except (OSError, ValueError):
        return None


def write_gate(run_dir: Path, attempt: AttemptId, record: dict[str, Any]) -> None:
    fsutil.atomic_write_json(gate_path(run_dir, attempt), record, 0o600)


def mark_printed(run_dir: Path, attempt: AttemptId, record: dict[str, Any]) -> None:
    """The verdicts are in the batch log now (by the watchdog or the end hook): once only."""
    write_gate(run_dir, attempt, {**record, "printed": True})
