"""A heterogeneous job's services as the run directory holds them: one record per service,
``components/<name>.json``, written by its supervisor (``job.components``) each time the
service starts or ends. One file per service, not per task or per node: a job has a few.

Read without trusting it (a missing or mistyped key is "not known"); torch-free, no Slurm
calls.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ddlaunch.fsutil import atomic_write_json
from ddlaunch.store.records import Problem, load_json, text, whole

COMPONENTS_DIR = "components"

RUNNING = "running"
RESTARTING = "restarting"
FAILED = "failed"  # it failed more often than fault_tolerance.max_restarts allows
STOPPED = "stopped"  # the job's end stopped it
ENDED = "ended"  # it ended on its own with status 0
STATES = (RUNNING, RESTARTING, FAILED, STOPPED, ENDED)


@dataclass(frozen=True)
class ServiceState:
    """``starts``: how often its step was started (1 + its restarts); ``last_exit``: the
    status of its last step that ended (None: none ended yet); ``time``: when this state
    was written (epoch s)."""

    name: str
    state: str
    starts: int
    last_exit: int | None = None
    time: float = 0.0

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)


def record_path(run_dir: Path, name: str) -> Path:
    return run_dir / COMPONENTS_DIR / f"{name}.json"


def write(run_dir: Path, state: ServiceState) -> None:
    path = record_path(run_dir, state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, asdict(state) | {"time": state.time or time.time()})


def read_all(run_dir: Path) -> tuple[list[ServiceState], list[Problem]]:
    """Every service's record, by name; a record that cannot be used is a problem."""
    out: list[ServiceState] = []
    problems: list[Problem] = []
    folder = run_dir / COMPONENTS_DIR
    if not folder.is_dir():
        return out, problems
    for path in sorted(folder.glob("*.json")):
        name = f"{COMPONENTS_DIR}/{path.name}"
        value, problem = load_json(path, dict, name=name)
        if problem is not None:
            problems.append(problem)
            continue
        state = text(value.get("state"))
        out.append(
            ServiceState(
                name=text(value.get("name")) or path.stem,
                state=state if state in STATES else "unknown",
                starts=whole(value.get("starts")) or 0,
                last_exit=whole(value.get("last_exit")),
                time=float(value.get("time") or 0.0)
                if isinstance(value.get("time"), int | float)
                else 0.0,
            )
        )
    return out, problems


def describe(state: ServiceState) -> str:
    """One line for ``status``: ``server: running (restarted 1 time, last exit 1)``."""
    parts = []
    if state.restarts:
        parts.append(f"restarted {state.restarts} time{'s' if state.restarts > 1 else ''}")
    if state.last_exit is not None:
        parts.append(f"last exit {state.last_exit}")
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"{state.name}: {state.state}{detail}"
