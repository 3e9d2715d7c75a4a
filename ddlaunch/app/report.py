"""A run's history as plain data for ``ddlaunch report``.

Attempts (start, end, nodes, cause, blamed nodes), checkpoint commits, rank failures, the
replica groups' restarts (``app.report_groups``), the in-process restarts
(``app.report_inprocess``), a heterogeneous job's components (``app.report_components``: a
lane each) and the step history (``health/steps.jsonl``,
one sample per watchdog poll in which the step advanced, and ``timings.jsonl``, every save and
each attempt's first step as the training code recorded them) become one
``Timeline`` (``build`` is pure; ``load_timeline`` reads the run
directory); ``throughput`` turns the samples into steps per second; ``html_page`` lays it
out around the picture (drawn by ``app.report_figure``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import itertools
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.app import report_components, report_inprocess
from ddlaunch.app.report_groups import GroupRestart, from_attempts
from ddlaunch.app.report_inprocess import InProcessRow
from ddlaunch.app.runs import read_run
from ddlaunch.app.status import run_status
from ddlaunch.app.status_blame import ended_words
from ddlaunch.app.status_poll import Target, poll
from ddlaunch.checkpoint import adapters
from ddlaunch.checkpoint.layout import list_checkpoints
from ddlaunch.config.trainers import KIND_DDLAUNCH
from ddlaunch.policy.staging import NodeStaging, node_line
from ddlaunch.slurm.client import JobRows, SlurmError
from ddlaunch.store import staging as staging_records
from ddlaunch.store import timings
from ddlaunch.store import watchdog as watchdog_records
from ddlaunch.store.attempts import AttemptRecord
from ddlaunch.store.failures import every_failure, is_collateral
from ddlaunch.store.inprocess import describe, recovered_count
from ddlaunch.store.rundir import checkpoint_source


@dataclass(frozen=True)
class AttemptSpan:
    attempt: int
    job_id: str
    nodes: str
    start: float
    end: float | None
    cause: str
    blamed: tuple[str, ...] = ()
    resumed_from: int | None = None
    committed_step: int | None = None
    detail: str = ""
    # The attempt's data staging phase: from the first node's start to the last node's end.
    staging: tuple[float, float] | None = None
    staging_detail: str = ""
    in_allocation: bool = False  # the batch script restarted the ranks: no requeue
    shrunk: str = ""  # on fewer nodes than nodes.count (nodes.min): the world size changed
    in_process: int = 0  # failures its ranks recovered from in process (standbys took ranks)

    @property
    def how(self) -> str:
        """The job column: a restart inside the allocation must not read as a requeue, and a
        shrunk world size is said."""
        how = f"{self.job_id} (restart in the allocation)" if self.in_allocation else self.job_id
        return f"{how} (shrunk: {self.shrunk})" if self.shrunk else how

    @property
    def staging_s(self) -> float | None:
        return None if self.staging is None else self.staging[1] - self.staging[0]


def staging_phase(
    records: Mapping[str, NodeStaging], now: float | None
) -> tuple[tuple[float, float] | None, str]:
    """One attempt's staging records (host -> record) as (start, end) and a summary."""
    starts = [float(r.start) for r in records.values() if r.start is not None]
    if not starts:
        return None, ""
    ends = [float(r.end or now or r.start) for r in records.values() if r.start]
    detail = ", ".join(node_line(h, r) for h, r in sorted(records.items()))
    return (min(starts), max(ends)), detail


@dataclass(frozen=True)
class Event:
    time: float
    kind: str  # "checkpoint" (complete, on disk) | "save" (recorded, since pruned) | "failure"
    label: str
    step: int | None = None


@dataclass
class Timeline:
    run_id: str
    state: str
    attempts: list[AttemptSpan] = field(default_factory=list)
    # Why the run ended, in status's words (its failure; why no attempt followed): the title
    # says it beside the state. Empty while it runs, or when the state says it all.
    ended: str = ""
    events: list[Event] = field(default_factory=list)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time, step)
    series: list[str] = field(default_factory=list)  # which attempt each sample belongs to
    excluded: list[str] = field(default_factory=list)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""  # why there is nothing to draw (a submission that failed, ...)
    problems: list[str] = field(default_factory=list)  # records that could not be read
    group_restarts: list[GroupRestart] = field(default_factory=list)  # replica groups
    groups: int = 0  # replica groups: how many the job has (0: not in that mode, or unknown)
    in_process: list[InProcessRow] = field(default_factory=list)  # restart: in_process
    components: report_components.Components | None = None  # components: a lane each

    @property
    def headline(self) -> str:
        """The state, and why the run ended where that is known: ``FAILED (rank 1 on node1:
        ValueError: boom; stopped: 2 restarts in the allocation reached
        fault_tolerance.max_restarts=2, ...)``."""
        return f"{self.state} ({self.ended})" if self.ended else self.state

    @property
    def origin(self) -> float:
        times = [a.start for a in self.attempts] + [e.time for e in self.events]
        times += [t for t, _ in self.samples] + [g.time for g in self.group_restarts]
        times += [r.time for r in self.in_process if r.time is not None]
        times += report_components.times(self.components)
        return min(times) if times else 0.0


def build(
    run_id: str,
    state: str,
    attempts: Sequence[AttemptRecord],
    checkpoints: Sequence[tuple[int, float]],
    failures: Sequence[Mapping[str, Any]],
    samples: Sequence[Mapping[str, Any]],
    excluded: Sequence[str] = (),
    preflight: Sequence[Mapping[str, Any]] = (),
    now: float | None = None,
    staging: Mapping[str, Mapping[str, NodeStaging]] | None = None,
    note: str = "",
    groups: int = 0,
    saves: Sequence[tuple[int, float]] = (),
) -> Timeline:
    """``staging``: attempt key (``<job>-<restart>``) -> host -> staging record;
    ``groups``: the replica groups' count, where known; ``saves``: (step, time) of every
    save the training code recorded (``timings.jsonl``), those whose checkpoint is no longer
    on disk (``keep_last`` pruned it) drawn apart from the complete ones."""
    t = Timeline(run_id, state, excluded=list(excluded), preflight=[dict(p) for p in preflight])
    t.note = note
    t.group_restarts = from_attempts(attempts)
    t.groups = groups
    t.in_process = report_inprocess.from_attempts(attempts)
    for rec in attempts:
        if rec.start is None:
            continue
        phase, phase_detail = staging_phase((staging or {}).get(rec.key, {}), now)
        t.attempts.append(
            AttemptSpan(
                attempt=rec.attempt if rec.attempt is not None else len(t.attempts),
                job_id=rec.job_id or "",
                nodes=rec.nodes or "",
                start=float(rec.start),
                end=float(rec.end) if rec.end is not None else now,
                cause=rec.cause or "running",
                blamed=rec.blamed or (),
                resumed_from=rec.resumed_from,
                committed_step=rec.committed_step,
                detail=attempt_detail(rec, failures),
                staging=phase,
                staging_detail=phase_detail,
                in_allocation=bool(rec.in_allocation),
                shrunk=rec.shrunk or "",
                in_process=recovered_count([rec]),
            )
        )
    for step, when in checkpoints:
        t.events.append(Event(float(when), "checkpoint", f"step {step}", step))
    kept = {step for step, _ in checkpoints}
    for step, when in saves:
        if step not in kept:
            t.events.append(Event(float(when), "save", f"step {step}: no longer on disk", step))
    for f in failures:
        if f.get("time") is not None:
            label = f"rank {f.get('rank')} on {f.get('host')}: {f.get('exception')}"
            if f.get("collateral"):  # the rank failed because a peer did
                label += " (after a peer failed)"
            t.events.append(Event(float(f["time"]), "failure", label))
    # A rank a standby replaced is a failure too, and a killed one left no record of its own.
    t.events += [
        Event(r.time, "failure", describe(r.restart)) for r in t.in_process if r.time is not None
    ]
    t.events.sort(key=lambda e: e.time)
    points = sorted(
        (
            float(s["time"]),
            int(s["step"]),
            f"{s.get('job_id', '')}-{s.get('restart', '')}.{s.get('relaunch') or 0}",
        )
        for s in samples
        if s.get("time") is not None and s.get("step") is not None
    )
    t.samples = [(time_, step) for time_, step, _ in points]
    t.series = [key for _, _, key in points]
    return t


def attempt_detail(rec: AttemptRecord, failures: Sequence[Mapping[str, Any]]) -> str:
    """What an attempt's row says beside its cause: a health finding, a crashed attempt's
    first failing rank (the exception, not the requeue policy's words), else the decision."""
    if rec.health:
        return rec.health
    if rec.culprit:  # the end hook's attribution: a killed rank leaves no record
        return rec.culprit
    if rec.cause == "crash":
        mine = [
            f
            for f in failures
            if str(f.get("job_id")) == str(rec.job_id)
            and int(f.get("attempt") or 0) == (rec.restart_count or 0)
            and int(f.get("relaunch") or 0) == (rec.relaunch or 0)
        ]
        if mine:
            first = min(mine, key=lambda f: float(f.get("time") or 0.0))
            where = f" at {first['where']}" if first.get("where") else ""
            return (
                f"rank {first.get('rank')} on {first.get('host')}: "
                f"{first.get('exception')}: {first.get('message', '')}{where}"
            )
    return rec.decision or ""


def split_series(t: Timeline) -> list[list[tuple[float, int]]]:
    """The samples cut where the attempt changes: a line must not bridge a requeue."""
    out: list[list[tuple[float, int]]] = []
    keys = t.series or [""] * len(t.samples)
    for i, point in enumerate(t.samples):
        if not out or keys[i] != keys[i - 1]:
            out.append([])
        out[-1].append(point)
    return out


def throughput(samples: Sequence[tuple[float, int]]) -> list[tuple[float, float]]:
    """(time at the interval's end, steps per second) between consecutive samples; a step
    that went back (a resume from an older checkpoint) starts a new series; one that did not
    advance gives no point."""
    out = []
    for (t0, s0), (t1, s1) in itertools.pairwise(samples):
        if t1 > t0 and s1 > s0:  # a repeated step (the final save) is no rate of 0
            out.append((t1, (s1 - s0) / (t1 - t0)))
    return out


CAUSE_COLORS = {
    "completed": "#2e7d32",
    "signal": "#1565c0",
    "preflight": "#ef6c00",
    "hang": "#c62828",
    "straggler": "#ad1457",
    "crash": "#b71c1c",
    "node failure": "#6a1b9a",
    "requeued by Slurm": "#6a1b9a",
    "cancelled": "#9e9e9e",
    "job ended": "#9e9e9e",
    "running": "#90a4ae",
}


def color(cause: str) -> str:
    return CAUSE_COLORS.get(cause, "#757575")


def _fmt_time(ts: float | None, origin: float) -> str:
    return "-" if ts is None else f"+{(ts - origin) / 60:.1f} min"


def _staging_cell(a: AttemptSpan) -> str:
    if a.staging_s is None:
        return ""
    return html.escape(f"{a.staging_s:.1f} s: {a.staging_detail}")


def html_page(t: Timeline, png_b64: str) -> str:
    """The report page: the picture (embedded) and the same facts as tables."""
    e = html.escape
    o = t.origin
    rows = "".join(
        f"<tr><td>{a.attempt}</td><td>{e(a.how)}</td><td>{e(a.nodes)}</td>"
        f"<td>{_fmt_time(a.start, o)}</td>"
        f"<td>{'' if a.end is None else f'{a.end - a.start:.0f} s'}</td>"
        f"<td style='color:{color(a.cause)}'><b>{e(a.cause)}</b></td>"
        f"<td>{'' if a.resumed_from is None else a.resumed_from}</td>"
        f"<td>{'' if a.committed_step is None else a.committed_step}</td>"
        f"<td>{e(','.join(a.blamed))}</td><td>{_staging_cell(a)}</td><td>{e(a.detail)}</td></tr>"
        for a in t.attempts
    )
    events = "".join(
        f"<tr><td>{_fmt_time(ev.time, o)}</td><td>{e(ev.kind)}</td><td>{e(ev.label)}</td></tr>"
        for ev in t.events
    )

    def checks(v: Mapping[str, Any]) -> str:
        return "; ".join(f"{c.get('name', '')}: {c.get('detail', '')}" for c in v.get("checks", []))

    preflight = "".join(
        f"<tr><td>{e(str(v.get('node')))}</td><td>{'ok' if v.get('ok') else 'FAILED'}</td>"
        f"<td>{e(checks(v))}</td></tr>"
        for v in t.preflight
    )
    excluded = e(", ".join(t.excluded)) or "none"
    problems = "".join(f"<p><b>{e(p)}</b></p>" for p in t.problems)
    restart_tables = group_restarts_html(t) + in_process_html(t)
    restart_tables += report_components.components_html(t.components, o)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ddlaunch report {e(t.run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left}}th{{background:#eee}}img{{max-width:100%}}</style></head>
<body><h1>Run {e(t.run_id)}: {e(t.headline)}</h1>
<img alt="timeline of attempts, checkpoints, failures and step throughput"
 src="data:image/png;base64,{png_b64}">
<h2>Attempts</h2><table><tr><th>#</th><th>job</th><th>nodes</th><th>start</th>
<th>duration</th><th>cause</th><th>resumed from</th><th>committed</th><th>blamed</th>
<th>data staging</th><th>detail</th></tr>{rows}</table>
<p>Excluded nodes: {excluded}</p>{restart_tables}
<h2>Checkpoints and failures</h2><table><tr><th>time</th><th>what</th><th>detail</th></tr>
{events}</table>
{problems}<h2>Latest preflight</h2><table><tr><th>node</th><th>verdict</th><th>checks</th></tr>
{preflight}</table></body></html>
"""


def group_restarts_html(t: Timeline) -> str:
    """The replica groups' restarts as a table (empty outside that mode): when, why, who,
    where to, when it was back and how far behind it fell."""
    if not t.group_restarts:
        return ""
    e = html.escape
    o = t.origin

    def cell(value: object) -> str:
        return "" if value is None else e(str(value))

    rows = "".join(
        f"<tr><td>{g.attempt}</td><td>{g.group}</td><td>{_fmt_time(g.time, o)}</td>"
        f"<td style='color:{color(g.cause)}'><b>{e(g.cause)}</b></td><td>{e(g.culprit)}</td>"
        f"<td>{e(','.join(g.nodes))}</td>"
        f"<td>{e(_restart_outcome(g))}</td>"
        f"<td>{'' if g.rejoin_s is None else f'{g.rejoin_s:.1f} s'}</td>"
        f"<td>{cell(g.failed_at_step)}</td><td>{cell(g.rejoined_step)}</td>"
        f"<td>{cell(g.steps_missed)}</td><td>{cell(g.healed_from)}</td></tr>"
        for g in t.group_restarts
    )
    return (
        "\n<h2>Replica group restarts</h2><table><tr><th>attempt</th><th>group</th>"
        "<th>time</th><th>cause</th><th>culprit</th><th>nodes</th><th>then</th>"
        "<th>rejoined after</th><th>failed at step</th><th>rejoined at step</th>"
        f"<th>steps missed</th><th>healed from group</th></tr>{rows}</table>"
    )


def in_process_html(t: Timeline) -> str:
    """The in-process restarts as a table (empty without any), under the sentence that
    counts the failures the ranks recovered from: when, which ranks died, which standbys
    took them, where the state came from, how long the ranks took to rejoin."""
    if not t.in_process:
        return ""
    note = html.escape(report_inprocess.recovered_note(t.in_process))
    rows = "".join(_in_process_row(row, t.origin) for row in t.in_process)
    return (
        f"\n<h2>In-process restarts</h2><p>{note}</p>"
        "<table><tr><th>attempt</th><th>generation</th><th>time</th><th>cause</th>"
        "<th>ranks</th><th>taken by</th><th>state from</th><th>resumed from step</th>"
        f"<th>rejoined after</th><th>then</th></tr>{rows}</table>"
    )


def _in_process_row(row: InProcessRow, origin: float) -> str:
    e = html.escape
    r = row.restart
    return (
        f"<tr><td>{row.attempt}</td><td>{'' if r.generation is None else r.generation}</td>"
        f"<td>{_fmt_time(r.time, origin)}</td>"
        f"<td style='color:{color(r.cause)}'><b>{e(r.cause)}</b></td>"
        f"<td>{e(report_inprocess.ranks_cell(r))}</td>"
        f"<td>{e(report_inprocess.standbys_cell(r))}</td>"
        f"<td>{e(report_inprocess.state_cell(r))}</td>"
        f"<td>{'' if r.resumed_from is None else r.resumed_from}</td>"
        f"<td>{'' if r.rejoined_s is None else f'{r.rejoined_s:.1f} s'}</td>"
        f"<td>{e(report_inprocess.outcome_cell(r))}</td></tr>"
    )


def _restart_outcome(g: GroupRestart) -> str:
    if g.decision == "restart":
        where = f"restarted on {','.join(g.new_nodes)}" if g.new_nodes else "restarted"
        return where if g.rejoin_s is not None else f"{where}; not back"
    return g.why or g.decision


def checkpoint_times(run_dir: Path) -> list[tuple[int, float]]:
    """(step, commit time) of every complete checkpoint: ddlaunch's commit marker's time for
    Session runs, the entry's modification time for other trainers."""
    source = checkpoint_source(run_dir)
    if source.kind == KIND_DDLAUNCH:
        return [
            (c.step, c.marker.time)
            for c in list_checkpoints(source.root)
            if c.complete and c.marker is not None
        ]
    out = []
    for found in adapters.scan(source.root, source.layout):
        if found.complete and found.step is not None:
            try:
                out.append((found.step, found.path.stat().st_mtime))
            except OSError:
                continue
    return out


def _attempt_at(attempts: Sequence[AttemptRecord], when: float) -> str:
    """The attempt running at ``when`` (a checkpoint's commit): its samples form one line."""
    for rec in reversed(attempts):
        if rec.start is not None and rec.start <= when:
            return "" if rec.attempt is None else str(rec.attempt)
    return ""


def load_timeline(run_dir: Path, client: JobRows | None = None) -> Timeline:
    """Everything ``report`` draws, from the run directory; the state as ``status`` says it
    (``client``: one queue query, as a status poll makes; None: the run directory alone).
    A run restarting in its allocation has a failed attempt and is still running."""
    info = read_run(run_dir)
    row = run_status(info, None)
    if client is not None and info.outcome is None:
        # No Slurm here (a copied run directory): what the records say.
        with contextlib.suppress(SlurmError):
            (row,) = poll([Target(run_dir)], client, read=lambda _: info)
    state = row.state
    # Without a readable config (info.problems says so) the checkpoints cannot be found.
    checkpoints = checkpoint_times(run_dir) if info.checkpoint_root is not None else []
    # Every failure of every attempt, those a resume archived too: our own stops (a signal
    # save) are not failures.
    failures = [
        {**dataclasses.asdict(f), "collateral": is_collateral(f)} for f in every_failure(run_dir)
    ]
    # Every save and every attempt's first step, as the training code recorded them: the
    # checkpoints on disk are only the last keep_last, the watchdog's samples only Slurm's.
    timed = [
        (float(r.time), r.step, r.kind)
        for r in timings.read(run_dir)
        if r.time is not None
        and r.step is not None
        and r.kind in (timings.SAVE, timings.FIRST_STEP)
    ]
    # Each attempt's curve, from the exact points where it has them: the training code
    # recorded the time it reached each step it saved at and its first step. Otherwise from
    # the watchdog's samples (one per poll in which the step advanced; the step as of the
    # ranks' last beat, up to health.heartbeat_interval older than the poll) and the
    # checkpoints' commit times (an async save commits after the loop has gone on): neither
    # is mixed with exact points, whose rates they would bend. A line never bridges a requeue:
    # each point belongs to the attempt running at its time.
    exact = [(when, step) for when, step, _ in timed]
    rough = [
        (float(s.time), s.step)
        for s in watchdog_records.read_samples(run_dir)
        if s.time is not None and s.step is not None
    ]
    rough += [(float(when), int(step)) for step, when in checkpoints]
    timed_attempts = Counter(_attempt_at(info.attempts, when) for when, _ in exact)
    points = exact + [
        (when, step) for when, step in rough if timed_attempts[_attempt_at(info.attempts, when)] < 2
    ]
    samples = [
        {"time": when, "step": step, "job_id": _attempt_at(info.attempts, when)}
        for when, step in sorted(set(points))
    ]
    latest = info.preflight  # read and checked by read_run
    timeline = build(
        info.run_id,
        state,
        info.attempts,
        checkpoints,
        failures,
        samples,
        info.excluded,
        (latest.verdicts or ()) if latest is not None else (),
        now=time.time(),
        staging=staging_records.read_all(run_dir),  # unusable ones: in info.problems
        note="" if info.attempts else f"no attempt: {row.failure or row.detail or state}",
        groups=len(info.groups.groups) if info.groups is not None else 0,
        saves=[(step, when) for when, step, kind in timed if kind == timings.SAVE],
    )
    timeline.ended = ended_words(row.failure, row.detail)
    timeline.problems = list(info.problems)
    timeline.components = report_components.load(run_dir, info.services, state)
    return timeline
