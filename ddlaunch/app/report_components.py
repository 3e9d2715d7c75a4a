"""A heterogeneous job's components for ``ddlaunch report`` (``components:``): a lane each.

A train component is its ranks (numbered component by component, as
``DDLAUNCH_TRAIN_COMPONENTS`` tells them), the nodes they last beat from and their step
time as their latest heartbeats measured it (seconds a step, and of it the time computing
rather than waiting for peers: in one world every rank steps at the slowest's pace, the
computing time tells the fast from the slow). A service is its starts over time, as its
supervisor recorded them (``components/<name>.json``): when each ran, how it ended; its
state in the words ``status`` gives it, checked against the job's state as ``status`` is.

``train_lanes``, ``service_bars`` and the page's tables are pure; ``load`` reads the run
directory (its resolved config, the latest heartbeats, the services' records).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from ddlaunch.policy.beats import Beat
from ddlaunch.slurm.hostlist import compress_hostlist
from ddlaunch.store.components import CANCELLED, STOPPED, ServiceRun, ServiceState, describe
from ddlaunch.store.heartbeats import read_heartbeats
from ddlaunch.store.records import Unreadable
from ddlaunch.store.rundir import read_config_tree
from ddlaunch.wording import plural

TRAIN, SERVICE = "train", "service"


@dataclass(frozen=True)
class TrainLane:
    """One train component: ranks ``first_rank``..``first_rank + ranks - 1`` on ``nodes``
    nodes; ``hosts``, ``step_time``, ``busy_time`` and ``step`` from its ranks' latest
    heartbeats (empty and None without any)."""

    name: str
    first_rank: int
    ranks: int
    nodes: int
    hosts: tuple[str, ...] = ()
    step_time: float | None = None  # seconds a step, the mean of its ranks'
    busy_time: float | None = None  # of it, computing (not waiting for peers)
    step: int | None = None  # the step its slowest rank reached

    @property
    def rank_span(self) -> str:
        last = self.first_rank + self.ranks - 1
        return str(self.first_rank) if last == self.first_rank else f"{self.first_rank}-{last}"

    def where(self) -> str:
        count = f"{self.nodes} {plural(self.nodes, 'node')}"
        return f"{count}: {compress_hostlist(self.hosts)}" if self.hosts else count

    def pace(self) -> str:
        """``1.20 s a step (0.83 steps/s), computing 0.40 s of it``; empty when unknown."""
        if self.step_time is None or self.step_time <= 0:
            return ""
        text = f"{self.step_time:.2f} s a step ({1 / self.step_time:.2f} steps/s)"
        if self.busy_time is not None:
            text += f", computing {self.busy_time:.2f} s of it"
        return text

    def label(self) -> str:
        """The lane's label on the picture."""
        pace = self.pace()
        return f"{self.name}: ranks {self.rank_span} on {self.where()}" + (
            f", {pace}" if pace else ""
        )


@dataclass
class Components:
    """Every component in the order of ``components:``; ``beats``: which attempt's
    heartbeats the train lanes' hosts and pace come from (empty: none); ``job_state``: the
    run's state as ``status`` says it (None: not known), which a service's record that says
    it runs must agree with."""

    train: list[TrainLane] = field(default_factory=list)
    services: list[ServiceState] = field(default_factory=list)
    beats: str = ""
    job_state: str | None = None

    @property
    def lanes(self) -> list[str]:
        """The picture's lane labels, top to bottom."""
        return [f"train {t.name}" for t in self.train] + [
            f"service {s.name}" for s in self.services
        ]


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _entries(tree: Mapping[str, object]) -> list[Mapping[str, Any]]:
    found = tree.get("components")
    items = found if isinstance(found, list) else []
    return [e for e in items if isinstance(e, dict) and isinstance(e.get("name"), str)]


def train_lanes(tree: Mapping[str, object], beats: Sequence[Beat]) -> list[TrainLane]:
    """The train components of a resolved config (``components:``, ``nodes.gpus_per_node``
    for a component that does not say), their ranks numbered in order, with ``beats`` (one
    attempt's) sorted to them by rank."""
    nodes = tree.get("nodes")
    default_gpus = _whole(nodes.get("gpus_per_node")) if isinstance(nodes, dict) else None
    out: list[TrainLane] = []
    first = 0
    for entry in _entries(tree):
        if (entry.get("role") or TRAIN) != TRAIN:
            continue
        found = entry.get("nodes")
        own: Mapping[str, object] = found if isinstance(found, dict) else {}
        count = _whole(own.get("count")) or 1
        gpus = _whole(own.get("gpus_per_node"))
        gpus = default_gpus if gpus is None else gpus
        per_node = gpus or _whole(own.get("tasks_per_node")) or 1
        ranks = count * per_node
        mine = [b for b in beats if first <= b.rank < first + ranks]
        times = [b.step_time for b in mine if b.step_time is not None]
        busy = [b.busy_time for b in mine if b.busy_time is not None]
        steps = [b.step for b in mine if b.step is not None]
        out.append(
            TrainLane(
                name=entry["name"],
                first_rank=first,
                ranks=ranks,
                nodes=count,
                hosts=tuple(sorted({b.host for b in mine})),
                step_time=fmean(times) if times else None,
                busy_time=fmean(busy) if busy else None,
                step=min(steps) if steps else None,
            )
        )
        first += ranks
    return out


def latest_attempt(records: Sequence[Mapping[str, object]]) -> tuple[list[Beat], str]:
    """The beats of the attempt that beat last (a node's record of an earlier attempt stays
    in the directory), and that attempt in words (``job 12``, ``job 12, restart 1``)."""
    if not records:
        return [], ""

    def key(rec: Mapping[str, object]) -> tuple[str, object, object]:
        return (str(rec.get("job_id")), rec.get("restart") or 0, rec.get("relaunch") or 0)

    newest = max(records, key=lambda r: Beat.from_record(r).beat)
    wanted = key(newest)
    beats = [Beat.from_record(r) for r in records if key(r) == wanted]
    job, restart, relaunch = wanted
    words = f"job {job}" + (f", restart {restart}" if restart else "")
    return beats, words + (f", relaunch {relaunch}" if relaunch else "")


def load(
    run_dir: Path, services: Sequence[ServiceState], job_state: str | None = None
) -> Components | None:
    """The run's components (None: it has none, or its config cannot be read, which the
    report's problems say already); ``job_state``: the run's, as ``status`` says it."""
    try:
        tree = read_config_tree(run_dir)
    except Unreadable:
        return None
    entries = _entries(tree)
    if not entries:
        return None
    beats, words = latest_attempt([dict(r) for r in read_heartbeats(run_dir)])
    order = {e["name"]: i for i, e in enumerate(entries)}
    ordered = sorted(services, key=lambda s: (order.get(s.name, len(order)), s.name))
    return Components(train_lanes(tree, beats), list(ordered), words if beats else "", job_state)


# ----------------------------------------------------------------- the services' lanes

RUNNING, ENDED, FAILED, STOPPED_BAR = "running", "ended", "failed", "stopped"
BAR_COLORS = {RUNNING: "#90a4ae", ENDED: "#2e7d32", FAILED: "#b71c1c", STOPPED_BAR: "#9e9e9e"}


@dataclass(frozen=True)
class ServiceBar:
    """One start of a service on its lane: from its start to its end (to ``now``, or to
    its start, while it runs or when its end is not known); ``how`` picks its colour."""

    start: float
    end: float
    how: str
    label: str


def how_it_ended(state: ServiceState, index: int) -> str:
    """``running``, ``ended`` (exit 0), ``stopped`` (the job's end or a cancel stopped it:
    the last start of a stopped service) or ``failed`` (any other exit)."""
    run = state.history[index]
    if run.end is None:
        return RUNNING
    if state.state == STOPPED and index == len(state.history) - 1:
        return STOPPED_BAR
    return ENDED if run.exit == 0 else FAILED


def _bar_label(state: ServiceState, index: int, how: str) -> str:
    run = state.history[index]
    if how == STOPPED_BAR:
        return "stopped by cancel" if state.reason == CANCELLED else "stopped"
    if how == FAILED:
        return f"exit {run.exit}" if run.exit is not None else "failed"
    return how


def service_bars(state: ServiceState, now: float | None) -> list[ServiceBar]:
    """The bars of a service's lane, one per start it keeps."""
    out = []
    for i, run in enumerate(state.history):
        how = how_it_ended(state, i)
        end = run.end if run.end is not None else (now if now is not None else run.start)
        out.append(ServiceBar(run.start, max(end, run.start), how, _bar_label(state, i, how)))
    return out


def failures(state: ServiceState) -> list[ServiceRun]:
    """The starts that failed (a non-zero exit that no stop caused)."""
    return [r for i, r in enumerate(state.history) if how_it_ended(state, i) == FAILED]


# ----------------------------------------------------------------- the page


def _minutes(ts: float | None, origin: float) -> str:
    return "-" if ts is None else f"+{(ts - origin) / 60:.1f} min"


def components_html(c: Components | None, origin: float) -> str:
    """The components' section of the page: the train components' table, then each
    service's line and its starts (empty for a run without components)."""
    if c is None:
        return ""
    e = html.escape
    train = "".join(
        f"<tr><td>{e(t.name)}</td><td>{t.rank_span}</td><td>{e(t.where())}</td>"
        f"<td>{'' if t.step is None else t.step}</td><td>{e(t.pace())}</td></tr>"
        for t in c.train
    )
    beats = f" (as of the latest heartbeats, {e(c.beats)})" if c.beats else " (no heartbeats)"
    out = (
        "\n<h2>Components</h2><p>The train components' ranks are one training world, "
        f"numbered component by component{beats}.</p>"
        "<table><tr><th>train component</th><th>ranks</th><th>nodes</th><th>step reached</th>"
        f"<th>pace</th></tr>{train}</table>"
    )
    for s in c.services:
        out += _service_html(s, origin, c.job_state)
    return out


def _service_html(s: ServiceState, origin: float, job_state: str | None) -> str:
    e = html.escape
    fails = len(failures(s))
    counted = f"{len(s.history)} {plural(len(s.history), 'start')}"
    counted += f", {fails} failed" if fails else ""
    if s.earlier:
        counted += f"; {s.earlier} earlier {plural(s.earlier, 'start')} not kept"
    rows = "".join(_service_row(s, i, origin) for i in range(len(s.history)))
    # The words of ``status``: a record that says the service runs, in a job that ended,
    # was left by a supervisor killed with the job, not by a service still running.
    said = describe(s, job_state)
    return (
        f"\n<h3>Service {e(s.name)}</h3><p>{e(said)}; {e(counted)}.</p>"
        "<table><tr><th>started</th><th>ended</th><th>ran</th><th>exit</th><th>then</th></tr>"
        f"{rows}</table>"
    )


def _service_row(s: ServiceState, index: int, origin: float) -> str:
    run, how = s.history[index], how_it_ended(s, index)
    return (
        f"<tr><td>{_minutes(run.start, origin)}</td><td>{_minutes(run.end, origin)}</td>"
        f"<td>{'' if run.end is None else f'{run.end - run.start:.0f} s'}</td>"
        f"<td>{'' if run.exit is None else run.exit}</td>"
        f"<td style='color:{BAR_COLORS[how]}'><b>{html.escape(_bar_label(s, index, how))}</b>"
        "</td></tr>"
    )


def times(c: Components | None) -> list[float]:
    """Every time the lanes draw (the services' starts and ends): the axis spans them."""
    if c is None:
        return []
    return [t for s in c.services for r in s.history for t in (r.start, r.end) if t is not None]
