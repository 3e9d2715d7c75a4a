"""A heterogeneous job's services as the run directory holds them: one record per service,
``components/<name>.json``, written by its supervisor (``job.components``) each time the
service starts or ends. One file per service, not per task or per node: a job has a few.
The record holds the service's latest state and its history: each start of its step, with
when that step ended and its exit status, the latest ``HISTORY_LIMIT`` of them (the earlier
ones are counted), kept across the run's jobs (``report`` draws it as the service's lane).

``components/<name>.stop``: a request to stop the service without ending the job
(``ddlaunch cancel RUN --component NAME``), for one job; the supervisor looks for it every
``STOP_POLL_S``, ends the service's step and records it ``stopped``, without starting it again.

Every file is written to a temp name and renamed. Read without trusting it (a missing or
mistyped key is "not known"); torch-free, no Slurm calls.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ddlaunch.fsutil import atomic_write_json
from ddlaunch.store.records import Problem, load_json, number, text, whole
from ddlaunch.wording import counted

COMPONENTS_DIR = "components"

RUNNING = "running"
RESTARTING = "restarting"
FAILED = "failed"  # it failed more often than fault_tolerance.max_restarts allows
STOPPED = "stopped"  # the job's end stopped it
ENDED = "ended"  # it ended on its own with status 0
STATES = (RUNNING, RESTARTING, FAILED, STOPPED, ENDED)

CANCELLED = "cancelled"  # a ``stopped`` service's reason: ddlaunch cancel --component
JOB_END = "job_end"  # ... the job's end (its supervisor's TERM); "": an older record's
HISTORY_LIMIT = 100  # starts a record keeps (the latest; the earlier ones are counted)
STOP_POLL_S = 1.0  # how often a supervisor looks for a stop request


@dataclass(frozen=True)
class ServiceRun:
    """One start of the service's step: when it started, when it ended and with which
    status (None and None: it runs, or its supervisor was killed before it could say)."""

    start: float
    end: float | None = None
    exit: int | None = None


@dataclass(frozen=True)
class ServiceState:
    """``starts``: how often its step was started in this job (1 + its restarts);
    ``last_exit``: the status of its last step that ended (None: none ended yet); ``time``:
    when this state was written (epoch s); ``history``: its latest starts in this run, oldest
    first, ``earlier`` the older ones no longer kept; ``reason``: why it was stopped
    (``job_end``, ``cancelled``); ``stop_signals``: the signals its step's tasks got when it
    was stopped, in order (``TERM``; ``TERM``, ``KILL`` when it outlived the grace; ``KILL``
    when only srun could be told, which turns a TERM into a KILL of its tasks; none: stopped
    while it waited to restart); ``job_id``: the job its supervisor runs in."""

    name: str
    state: str
    starts: int
    last_exit: int | None = None
    time: float = 0.0
    history: tuple[ServiceRun, ...] = ()
    earlier: int = 0
    reason: str = ""
    job_id: str | None = None
    stop_signals: tuple[str, ...] = ()

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)


def with_run(state: ServiceState, run: ServiceRun, limit: int = HISTORY_LIMIT) -> ServiceState:
    """``state`` with ``run`` appended to its history (the oldest dropped past ``limit``)."""
    history = (*state.history, run)
    dropped = max(0, len(history) - limit)
    return replace(state, history=history[dropped:], earlier=state.earlier + dropped)


def with_end(state: ServiceState, end: float, exit_code: int | None) -> ServiceState:
    """``state`` with its latest start ended at ``end`` with ``exit_code``."""
    if not state.history or state.history[-1].end is not None:
        return state
    last = replace(state.history[-1], end=end, exit=exit_code)
    return replace(state, history=(*state.history[:-1], last))


def record_path(run_dir: Path, name: str) -> Path:
    return run_dir / COMPONENTS_DIR / f"{name}.json"


def write(run_dir: Path, state: ServiceState) -> None:
    path = record_path(run_dir, state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, asdict(state) | {"time": state.time or time.time()})


def _history(value: Any) -> tuple[ServiceRun, ...]:
    """The ``history`` list as found: an entry without a start time is left out."""
    if not isinstance(value, list):
        return ()
    out = []
    for item in value:
        if isinstance(item, dict) and number(item.get("start")) is not None:
            out.append(
                ServiceRun(
                    float(item["start"]),
                    None if number(item.get("end")) is None else float(item["end"]),
                    whole(item.get("exit")),
                )
            )
    return tuple(out)


def _state(value: dict[str, Any], stem: str) -> ServiceState:
    state = text(value.get("state"))
    return ServiceState(
        name=text(value.get("name")) or stem,
        state=state if state in STATES else "unknown",
        starts=whole(value.get("starts")) or 0,
        last_exit=whole(value.get("last_exit")),
        time=float(value["time"]) if number(value.get("time")) is not None else 0.0,
        history=_history(value.get("history")),
        earlier=whole(value.get("earlier")) or 0,
        reason=text(value.get("reason")) or "",
        job_id=text(value.get("job_id")),
        stop_signals=_signals(value.get("stop_signals")),
    )


def _signals(value: Any) -> tuple[str, ...]:
    """``stop_signals`` as found: a name that is not one is left out."""
    if not isinstance(value, list):
        return ()
    return tuple(s for s in value if isinstance(s, str) and s.isalpha() and s.isupper())


def read_one(run_dir: Path, name: str) -> ServiceState | None:
    """One service's record; None when there is none or it cannot be used."""
    value, problem = load_json(record_path(run_dir, name), dict, name=name)
    if problem is not None or not isinstance(value, dict):
        return None
    return _state(value, name)


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
        out.append(_state(value, path.stem))
    return out, problems


# A record in one of these says the service's step runs or is about to: true only while the
# supervisor that wrote it lives, which it does no longer than its job runs.
LIVE = (RUNNING, RESTARTING)
# The job's states (as ``status`` folds Slurm's) in which its supervisors live.
JOB_RUNS = ("RUNNING", "SUSPENDED")
STOPPED_BY = {CANCELLED: "by ddlaunch cancel --component", JOB_END: "at the job's end"}


def shown_state(state: ServiceState, job_state: str | None) -> str:
    """The service's state as ``status`` says it, given its job's (``job_state``; None: not
    known, the record is taken as it is). A record that says the service runs is the truth
    only while the job runs: its supervisor records the service's end, but a supervisor
    killed with the job (a batch host that died, Slurm's KILL after its KillWait) never
    does, and its record would say ``running`` forever."""
    if state.state not in LIVE or job_state is None or job_state in JOB_RUNS:
        return state.state
    if job_state == "PENDING":  # requeued: its supervisor ended with the job's last run
        return "not running: the job waits in the queue"
    return "state unknown: its supervisor ended with the job before it recorded the service's end"


def describe(state: ServiceState, job_state: str | None = None) -> str:
    """One line for ``status``: ``server: running (restarted 1 time, last exit 1)``,
    ``server: stopped at the job's end (TERM; last exit 0)``. ``job_state``: the job's, which
    a record that says the service runs must agree with (``shown_state``)."""
    shown = shown_state(state, job_state)
    first: list[str] = []  # what the state itself needs said
    if shown != state.state:
        first.append(f"last recorded {state.state}")
    elif state.state == STOPPED:
        by = STOPPED_BY.get(state.reason)
        shown = f"{shown} {by}" if by else shown
        if state.stop_signals:  # what reached its tasks: "TERM", "TERM, then KILL"
            first.append(", then ".join(state.stop_signals))
    counts = []
    if state.restarts:
        counts.append(f"restarted {counted(state.restarts, 'time')}")
    if state.last_exit is not None:
        counts.append(f"last exit {state.last_exit}")
    groups = [", ".join(g) for g in (first, counts) if g]
    detail = f" ({'; '.join(groups)})" if groups else ""
    return f"{state.name}: {shown}{detail}"


@dataclass(frozen=True)
class StopRequest:
    """``components/<name>.stop``: stop the service in job ``job_id`` (None: whichever job
    reads it), asked at ``time``."""

    name: str
    job_id: str | None
    time: float


def stop_request_path(run_dir: Path, name: str) -> Path:
    return run_dir / COMPONENTS_DIR / f"{name}.stop"


def request_stop(run_dir: Path, name: str, job_id: str | None) -> StopRequest:
    request = StopRequest(name, job_id, time.time())
    atomic_write_json(stop_request_path(run_dir, name), asdict(request))
    return request


def read_stop_request(run_dir: Path, name: str) -> StopRequest | None:
    """The service's stop request; None without one (or one that cannot be used: the
    supervisor does not stop a service on a damaged file)."""
    path = stop_request_path(run_dir, name)  # one open a poll, none to stat it first
    value, problem = load_json(path, dict, name=f"{COMPONENTS_DIR}/{path.name}")
    if problem is not None or not isinstance(value, dict):
        return None
    when = number(value.get("time"))
    return StopRequest(name, text(value.get("job_id")), 0.0 if when is None else float(when))
