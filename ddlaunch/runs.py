"""Reading runs back from their run directories (torch-free; used by status, logs, cancel).

The run directory is the source of truth: job ids, attempts, failures, results and
checkpoints are all read from files there. Slurm is asked only for the live state.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.errors import UserError
from ddlaunch.rundir import DEFAULT_RUN_ROOT, resolve_run_root


def default_run_root() -> Path:
    return resolve_run_root(DEFAULT_RUN_ROOT)


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by path, by id under the run root, or by a unique id prefix."""
    as_path = Path(ref).expanduser()
    if (as_path / "config.yaml").is_file():
        return as_path.absolute()
    root = root or default_run_root()
    if (root / ref / "config.yaml").is_file():
        return root / ref
    matches = sorted(p for p in root.glob(f"{ref}*") if (p / "config.yaml").is_file())
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(
            f"no run {ref!r} (looked for a run directory at that path and under "
            f"{root}; set DDLAUNCH_RUN_ROOT or pass the run directory)"
        )
    names = ", ".join(p.name for p in matches[:5])
    raise UserError(f"{ref!r} matches {len(matches)} runs ({names}...); give more of the id")


def list_runs(root: Path | None = None) -> list[Path]:
    root = root or default_run_root()
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if (p / "config.yaml").is_file()]
    return sorted(runs, key=lambda p: p.stat().st_mtime)


@dataclass
class Failure:
    rank: int
    host: str
    exception: str
    message: str
    where: str | None
    job_id: str | None = None
    attempt: int | None = None
    traceback: str = ""

    def one_line(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"rank {self.rank} on {self.host}: {self.exception}: {self.message}{loc}"


@dataclass
class RunInfo:
    path: Path
    run_id: str
    job_ids: list[str] = field(default_factory=list)
    intent: dict[str, Any] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    result: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    checkpoint_root: Path | None = None
    latest_step: int | None = None
    progress: dict[str, Any] | None = None
    excluded: list[str] = field(default_factory=list)
    preflight: dict[str, Any] | None = None  # health/preflight.json: the latest verdicts
    watchdog: dict[str, Any] | None = None  # health/watchdog.json: heartbeat summary
    label: str | None = None  # a sweep member's overrides

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


def read_failures(run_dir: Path) -> list[Failure]:
    failures = []
    for path in sorted((run_dir / "failures").glob("rank-*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        failures.append(
            Failure(
                rank=int(rec.get("rank", -1)),
                host=str(rec.get("host", "?")),
                exception=str(rec.get("exception", "?")),
                message=str(rec.get("message", "")),
                where=rec.get("where"),
                job_id=rec.get("job_id"),
                attempt=rec.get("attempt"),
                traceback=str(rec.get("traceback", "")),
            )
        )
    # The earliest failure is usually the cause; the others are collateral (killed peers).
    failures.sort(key=lambda f: (f.attempt or 0, f.rank))
    return failures


def checkpoint_root(run_dir: Path) -> Path:
    """The run's checkpoint directory: ``storage.checkpoint_dir`` or ``<run dir>/checkpoints``.

    ``status`` reads this for every run it shows, so the common case (the key unset, written
    by ``yaml.safe_dump`` as ``checkpoint_dir: null``) is recognised from the text without a
    YAML parse; anything else is parsed properly.
    """
    text = (run_dir / "config.yaml").read_text()
    if text.count("checkpoint_dir:") == 1 and "  checkpoint_dir: null\n" in text:
        return run_dir / "checkpoints"
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    tree = yaml.load(text, Loader=loader) or {}  # a safe loader (C or pure Python)
    configured = (tree.get("storage") or {}).get("checkpoint_dir")
    return Path(configured) if configured else run_dir / "checkpoints"


def _json(path: Path, present: set[str], name: str, default: Any = None) -> Any:
    # One directory listing per run tells which files exist: status reads hundreds of run
    # directories per poll, and failed opens of absent files are most of the cost otherwise.
    if name not in present:
        return default
    try:
        return fsutil.read_json(path / name, default)
    except ValueError:
        return default


def read_run(run_dir: Path, *, with_checkpoints: bool = True) -> RunInfo:
    from ddlaunch.checkpoint.layout import latest_complete

    try:
        present = set(os.listdir(run_dir))
    except OSError:
        present = set()
    submission = _json(run_dir, present, "submission.json", {}) or {}
    info = RunInfo(path=run_dir, run_id=run_dir.name, job_ids=list(submission.get("job_ids", [])))
    info.intent = _json(run_dir, present, "intent.json", {}) or {}
    info.failures = read_failures(run_dir) if "failures" in present else []
    info.result = _json(run_dir, present, "result.json")
    info.attempts = list(_json(run_dir, present, "attempts.json", []) or [])
    info.outcome = _json(run_dir, present, "outcome.json")
    info.progress = _json(run_dir, present, "progress.json")
    info.excluded = list(_json(run_dir, present, "excluded_nodes.json", []) or [])
    if "health" in present:
        health = run_dir / "health"
        info.preflight = _json(health, {"preflight.json"}, "preflight.json")
        info.watchdog = _json(health, {"watchdog.json"}, "watchdog.json")
    if with_checkpoints and "config.yaml" in present:
        info.checkpoint_root = checkpoint_root(run_dir)
        root = info.checkpoint_root
        if root.parent != run_dir or root.name in present:
            latest = latest_complete(root) if root.is_dir() else None
            info.latest_step = latest.step if latest else None
    return info


def list_targets(root: Path | None = None) -> list[tuple[str, Path]]:
    """Runs and sweeps under the run root, oldest first: ("run" | "sweep", path)."""
    root = root or default_run_root()
    if not root.is_dir():
        return []
    out = []
    for entry in os.scandir(root):
        if not entry.is_dir():
            continue
        path = Path(entry.path)
        if (path / "config.yaml").is_file():
            out.append((entry.stat().st_mtime, "run", path))
        elif (path / "members.json").is_file():
            out.append((entry.stat().st_mtime, "sweep", path))
    return [(kind, path) for _, kind, path in sorted(out)]


def rank_log(run_dir: Path, rank: int, stream: str = "out") -> Path:
    return run_dir / "logs" / f"rank-{rank}.{stream}"


def batch_logs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "logs").glob("batch-*.out"), key=os.path.getmtime)
