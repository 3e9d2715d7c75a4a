"""The run directory: the source of truth for a run (config, script, intent, job ids).

Layout (every file written atomically)::

    <run_root>/<run_id>/            mode 0700
        config.yaml                 resolved config (what the job runs with)
        job.sbatch                  the rendered batch script
        intent.json                 written BEFORE sbatch: a crash after it never loses the run
        submission.json             job id(s), written after sbatch returned
        git.json, git.diff          commit and uncommitted changes of the submitting work tree
        logs/                       batch and per-rank logs
        submitit/                   submitit's job folder (pickled rank function, results)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil

DEFAULT_RUN_ROOT = "~/ddlaunch/runs"


def resolve_run_root(configured: str) -> Path:
    """$DDLAUNCH_RUN_ROOT replaces the built-in default; an explicit config value wins."""
    if configured == DEFAULT_RUN_ROOT and os.environ.get("DDLAUNCH_RUN_ROOT"):
        configured = os.environ["DDLAUNCH_RUN_ROOT"]
    return Path(os.path.expandvars(configured)).expanduser().absolute()


def new_run_id(job_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job_name}-{stamp}-{os.urandom(2).hex()}"  # not secrets: its import costs


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def create(cls, root: Path, run_id: str) -> RunDir:
        root.mkdir(parents=True, exist_ok=True)
        path = root / run_id
        path.mkdir(mode=0o700)  # fails if it exists: a run id is never reused
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        (path / "logs").mkdir()
        return cls(path)

    def write_text(self, name: str, text: str, mode: int = 0o600) -> Path:
        return fsutil.atomic_write_text(self.path / name, text, mode)

    def write_json(self, name: str, obj: Any) -> Path:
        return fsutil.atomic_write_json(self.path / name, obj, 0o600)

    def read_json(self, name: str, default: Any = None) -> Any:
        return fsutil.read_json(self.path / name, default)

    def write_config(self, plain: dict[str, Any]) -> Path:
        import yaml  # lazy: status and logs import this module but never write configs

        return self.write_text("config.yaml", yaml.safe_dump(plain, sort_keys=False))

    def read_config_tree(self) -> dict[str, Any]:
        import yaml

        return yaml.safe_load((self.path / "config.yaml").read_text()) or {}
