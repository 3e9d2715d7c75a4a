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
    import yaml

    tree = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    configured = (tree.get("storage") or {}).get("checkpoint_dir")
    return Path(configured) if configured else run_dir / "checkpoints"


def read_run(run_dir: Path) -> RunInfo:
    from ddlaunch.checkpoint.layout import latest_complete

    submission = fsutil.read_json(run_dir / "submission.json", {}) or {}
    info = RunInfo(path=run_dir, run_id=run_dir.name, job_ids=list(submission.get("job_ids", [])))
    info.intent = fsutil.read_json(run_dir / "intent.json", {}) or {}
    info.failures = read_failures(run_dir)
    info.result = fsutil.read_json(run_dir / "result.json")
    info.attempts = list(fsutil.read_json(run_dir / "attempts.json", []) or [])
    info.outcome = fsutil.read_json(run_dir / "outcome.json")
    info.progress = fsutil.read_json(run_dir / "progress.json")
    info.checkpoint_root = checkpoint_root(run_dir)
    latest = latest_complete(info.checkpoint_root) if info.checkpoint_root.is_dir() else None
    info.latest_step = latest.step if latest else None
    return info


def rank_log(run_dir: Path, rank: int, stream: str = "out") -> Path:
    return run_dir / "logs" / f"rank-{rank}.{stream}"


def batch_logs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "logs").glob("batch-*.out"), key=os.path.getmtime)
