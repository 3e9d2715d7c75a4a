"""Run status: the run directory joined with one batched Slurm query (pure joining logic).

``poll`` is the one place that talks to Slurm for ``status``: ONE squeue call per poll for
every job ddlaunch knows, whatever their number (array tasks of a sweep collapse to their
array id; ``-t all`` includes jobs that ended but are still kept by the controller), and at
most one batched ``sacct`` for jobs the controller forgot whose run directory does not
already know how they ended. The runner is injected, so tests count the calls.
Everything else (``run_status``, ``health_line``, ``sweep_row``) is pure.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ddlaunch.app.runs import (
    RunInfo,
    RunReader,
    complete_member_info,
    find_run,
    list_targets,
)
from ddlaunch.policy.requeue import HEALTH_CAUSES
from ddlaunch.slurm import queue
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.parse import QueueRow
from ddlaunch.store import sweeps
from ddlaunch.store.rundir import config_path, default_run_root, is_run_dir

# Slurm's many job states folded into the few a user acts on.
STATE_MAP = {
    "PENDING": "PENDING",
    "CONFIGURING": "PENDING",
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "RUNNING": "RUNNING",
    "COMPLETING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "SIGNALING": "RUNNING",
    "SUSPENDED": "SUSPENDED",
    "STOPPED": "SUSPENDED",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED",
    "OUT_OF_MEMORY": "FAILED",
    "BOOT_FAIL": "FAILED",
    "DEADLINE": "FAILED",
    "NODE_FAIL": "NODE_FAIL",
    "PREEMPTED": "PREEMPTED",
    "TIMEOUT": "TIMEOUT",
    "CANCELLED": "CANCELLED",
    "REVOKED": "CANCELLED",
}
ACTIVE_STATES = ("PENDING", "RUNNING", "SUSPENDED")


def fold_state(slurm_state: str) -> str:
    # sacct prints "CANCELLED by 0"; JSON of newer releases gives lists joined elsewhere.
    head = slurm_state.split()[0].upper() if slurm_state.strip() else ""
    return STATE_MAP.get(head, head or "UNKNOWN")


@dataclass
class RunStatus:
    run_id: str
    path: str
    job_id: str | None
    state: str
    nodes: str
    reason: str
    step: int | None
    checkpoint_step: int | None
    attempts: int
    failure: str | None
    detail: str | None
    label: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    health: str = ""
    heartbeat: dict[str, Any] | None = None
    snapshot: str | None = None  # the code snapshot the run's ranks use

    def as_dict(self) -> dict[str, Any]:
        # Shallow on purpose: the fields are plain data already, and dataclasses.asdict's deep
        # copy costs more than the rest of `status --json` for a 1000-member sweep.
        return {f.name: getattr(self, f.name) for f in fields(self)}


def attempt_history(info: RunInfo) -> list[dict[str, Any]]:
    """Each attempt in a compact, stable form: where it ran, how it ended and why."""
    out = []
    for rec in info.attempts:
        item = {
            "attempt": rec.get("attempt"),
            "job_id": rec.get("job_id"),
            "nodes": rec.get("nodes", ""),
            "start": rec.get("start"),
            "end": rec.get("end"),
            "cause": rec.get("cause") or ("running" if "end" not in rec else "?"),
            "resumed_from": rec.get("resumed_from"),
            "committed_step": rec.get("committed_step"),
            "blamed": list(rec.get("blamed") or []),
        }
        why = rec.get("health") or rec.get("signal")
        if why:
            item["detail"] = str(why)
        if rec.get("preflight"):
            item["preflight"] = rec["preflight"]
        out.append(item)
    return out


def health_line(info: RunInfo, now: float) -> str:
    """Node health in one line: the latest preflight, exclusions, the heartbeat."""
    parts = []
    if info.preflight:
        # Lazy: the verdicts module (statistics, enum) costs more than the rest of a poll.
        from ddlaunch.policy.preflight import summary_line

        parts.append("preflight " + summary_line(info.preflight.get("verdicts", [])))
    blamed = [
        f"{a.get('cause')} on {','.join(a['blamed'])}"
        for a in info.attempts
        if a.get("blamed") and a.get("cause") in HEALTH_CAUSES
    ]
    if blamed:
        parts.append("; ".join(blamed))
    if info.excluded:
        parts.append("excluded " + ",".join(info.excluded))
    hb = info.watchdog
    running = bool(info.attempts) and "end" not in info.attempts[-1]
    if hb and running:
        age = now - float(hb.get("time", now)) + float(hb.get("oldest_beat_age", 0.0))
        parts.append(f"heartbeat {age:.0f} s ago")
    return "; ".join(parts)


def run_status(
    info: RunInfo,
    queued: QueueRow | None,
    shown: dict[str, str] | None = None,
    now: float | None = None,
) -> RunStatus:
    """Combine what Slurm says (queue row, or scontrol fields for a job that left the queue)
    with what the run directory says."""
    now = time.time() if now is None else now
    nodes, reason = "", ""
    if queued is not None:
        state, nodes, reason = fold_state(queued.state), queued.nodes, queued.reason
    elif shown is not None:
        state = fold_state(shown.get("JobState", ""))
        nodes, reason = shown.get("NodeList", ""), shown.get("Reason", "")
    elif info.intent.get("target") == "kubernetes":
        state = pod_state(info)
    elif info.outcome:
        state = str(info.outcome.get("state", "UNKNOWN"))
    elif info.result is not None:
        state = "COMPLETED"
    elif info.failures:
        state = "FAILED"
    elif info.intent.get("state") == "failed":
        state = "SUBMIT_FAILED"
    else:
        state = "UNKNOWN"
    # A local run (or an outcome recorded by the job) is more precise than Slurm's view.
    if info.outcome and state in ("COMPLETED", "FAILED", "UNKNOWN", "CANCELLED"):
        state = str(info.outcome.get("state", state))
    failure = info.failures[0].one_line() if info.failures else None
    if state == "SUBMIT_FAILED":
        failure = str(info.intent.get("error", ""))
    detail = (
        str(info.outcome.get("reason")) if info.outcome and info.outcome.get("reason") else None
    )
    step = info.progress.get("step") if info.progress else None
    if info.watchdog and info.watchdog.get("step") is not None:
        step = max(step or 0, int(info.watchdog["step"]))
    if not nodes and info.attempts:
        nodes = str(info.attempts[-1].get("nodes", ""))
    return RunStatus(
        run_id=info.run_id,
        path=str(info.path),
        # A run on Kubernetes is known by its JobSet's or PyTorchJob's name.
        job_id=info.job_id or (info.intent.get("kubernetes") or {}).get("name"),
        state=state,
        nodes=nodes if nodes not in ("(null)", "None") else "",
        reason=reason if reason not in ("None", "(null)") else "",
        step=step,
        checkpoint_step=info.latest_step,
        attempts=max(len(info.attempts), 1 if info.job_ids else 0),
        failure=failure,
        detail=detail,
        label=info.label,
        history=attempt_history(info),
        excluded=list(info.excluded),
        health=health_line(info, now),
        heartbeat=info.watchdog,
        snapshot=info.snapshot,
    )


def pod_state(info: RunInfo) -> str:
    """A run of --target kubernetes, from its run directory alone (no API server call): the
    leader pod's records say whether an attempt runs, restarts or how the run ended."""
    if info.outcome:
        return str(info.outcome.get("state", "UNKNOWN"))
    if info.attempts:  # a pod started (applied here, or by hand from elsewhere)
        return "RUNNING" if "end" not in info.attempts[-1] else "RESTARTING"
    intent_state = info.intent.get("state")
    if intent_state == "failed":
        return "SUBMIT_FAILED"
    if intent_state == "written":
        return "NOT_APPLIED"  # kubectl could not run where it was submitted
    return "PENDING"  # applied; no pod has started (admission, scheduling, image pull)


class NoScheduler:
    """The Slurm client's place for ``status --target kubernetes``: no scheduler to ask."""

    def status_rows(self, job_ids: Sequence[str], form: str = "text") -> dict[str, QueueRow]:
        return {}

    def accounting_rows(self, job_ids: Sequence[str]) -> dict[str, QueueRow]:
        return {}


def needs_accounting(info: RunInfo) -> bool:
    """A job the controller forgot: only sacct can say how it ended, unless the run
    directory already knows (an outcome, a result)."""
    return bool(info.job_id) and info.outcome is None and info.result is None


@dataclass(frozen=True)
class Target:
    """What ``status`` shows: a run, or one member of a sweep (``sweep`` is its id)."""

    path: Path
    sweep: str | None = None
    label: str | None = None
    mtime_ns: int | None = None  # the run directory's, when listing it stat'ed it already


def poll(
    targets: Sequence[Target],
    client: Any,
    *,
    form: str = "text",
    read: Any = None,
    now: float | None = None,
    reader: Any = None,
) -> list[RunStatus]:
    """Read every run directory, make ONE squeue call for all their jobs (and at most one
    sacct for jobs the controller forgot), join. ``read`` replaces the cached reader
    (``runs.RunReader``; pass the one ``resolve`` used to share its loaded cache)."""
    reader = reader or RunReader()
    infos = []
    for t in targets:
        info = read(t.path) if read is not None else reader.read(t.path, t.mtime_ns)
        info.label = t.label
        if t.sweep:
            info.run_id = f"{t.sweep}/{t.path.name}"
            if not info.job_ids:  # a member that has not started has no run directory yet
                complete_member_info(info)
        infos.append(info)
    reader.save()
    job_ids = [i.job_id for i in infos if i.job_id]
    queue = client.status_rows(job_ids, form) if job_ids else {}
    gone = [i.job_id for i in infos if i.job_id and i.job_id not in queue and needs_accounting(i)]
    accounted = client.accounting_rows(gone) if gone else {}
    now = time.time() if now is None else now
    return [
        run_status(
            info, queue.get(info.job_id or "") or accounted.get(info.job_id or ""), None, now
        )
        for info in infos
    ]


def resolve(
    refs: Iterable[str], root: Path | None = None, reader: Any = None
) -> tuple[list[Target], list[str]]:
    """RUN or SWEEP references -> targets. Without refs: every run and sweep under the run
    root (sweeps are summarised by the caller). Returns (targets, sweep ids named).
    ``reader`` (a ``runs.RunReader``) lends its queued-run cache to the listing."""
    root = root or default_run_root()
    targets: list[Target] = []
    sweeps: list[str] = []
    refs = list(refs)
    if not refs:
        for kind, path, mtime_ns in list_targets(root, reader):
            if kind == "run":
                targets.append(Target(path, mtime_ns=mtime_ns))
            else:
                targets += _members(path)
        return targets, sweeps
    for ref in refs:
        if is_run_dir(Path(ref).expanduser()) or is_run_dir(root / ref):
            targets.append(Target(find_run(ref, root)))
            continue
        sweep = _find_sweep(ref, root)
        if sweep is not None:
            sweeps.append(sweep.name)
            targets += _members(sweep)
        else:
            targets.append(Target(find_run(ref, root)))
    return targets, sweeps


def _find_sweep(ref: str, root: Path) -> Path | None:
    for candidate in (Path(ref).expanduser(), root / ref):
        if candidate.is_dir() and sweeps.is_sweep_dir(candidate):
            return candidate.absolute()
    if is_run_dir(Path(ref).expanduser()) or is_run_dir(root / ref):
        return None
    matches = sorted(p for p in root.glob(f"{ref}*") if p.is_dir() and sweeps.is_sweep_dir(p))
    return matches[0] if len(matches) == 1 else None


def _members(path: Path) -> list[Target]:
    try:
        members = sweeps.member_run_dirs(path)
    except Exception:  # a broken sweep must not hide the other runs
        return []
    return [Target(run_dir, path.name, label) for label, run_dir in members]


def group_sweeps(rows: Sequence[RunStatus]) -> list[RunStatus]:
    """Overview form: one row per sweep (state counts), runs unchanged, order kept."""
    out: list[RunStatus] = []
    seen: dict[str, list[RunStatus]] = {}
    for row in rows:
        sweep_id = row.run_id.split("/")[0] if "/" in row.run_id else None
        if sweep_id is None:
            out.append(row)
            continue
        if sweep_id not in seen:
            seen[sweep_id] = []
            out.append(RunStatus(sweep_id, "", None, "", "", "", None, None, 0, None, None))
        seen[sweep_id].append(row)
    for i, row in enumerate(out):
        if row.run_id in seen and row.path == "":
            out[i] = sweep_row(row.run_id, seen[row.run_id])
    return out


def sweep_row(sweep_id: str, members: Sequence[RunStatus]) -> RunStatus:
    counts = Counter(m.state for m in members)
    state = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    jobs = sorted({(m.job_id or "").split("_")[0] for m in members if m.job_id})
    return RunStatus(
        run_id=sweep_id,
        path=str(Path(members[0].path).parent.parent) if members else "",
        job_id=",".join(jobs) or None,
        state=state,
        nodes="",
        reason="",
        step=None,
        checkpoint_step=None,
        attempts=sum(m.attempts for m in members),
        failure=None,
        detail=f"sweep of {len(members)} members (ddlaunch status {sweep_id})",
    )


def min_poll_interval() -> float:
    """The floor of ``status --watch``: 30 s unless $DDLAUNCH_MIN_POLL_S says otherwise (each
    poll is a query to the controller; thousands of users polling fast overload it)."""
    try:
        return float(os.environ.get("DDLAUNCH_MIN_POLL_S", "30"))
    except ValueError:
        return 30.0


def collect(
    refs: tuple[str, ...],
    runner: Any = None,
    *,
    overview: bool | None = None,
    target: str = "slurm",
) -> list[Any]:
    """One poll of ``status``: the runs and sweeps named by ``refs`` (all when empty), with
    ONE squeue call (none for ``target`` kubernetes: the run directories alone). ``runner``
    is injectable (tests count the Slurm calls it receives)."""
    reader = RunReader()  # one queued-run cache load for both the listing and the reads
    targets, _ = resolve(refs, reader=reader)
    if target == "kubernetes":
        rows = poll(targets, NoScheduler(), reader=reader)
    else:
        form = queue.choose_form(_slurm_version(targets), _forced_form())
        rows = poll(targets, SlurmClient(runner), form=form, reader=reader)
    grouped = not refs if overview is None else overview
    return group_sweeps(rows) if grouped else rows


def _forced_form() -> str | None:
    return os.environ.get("DDLAUNCH_SQUEUE_FORM") or None


def _slurm_version(targets: Sequence[Any]) -> str | None:
    """The cluster's release from the first run's config (cluster.slurm_version): no extra
    call to Slurm just to learn its version."""
    for target in targets[:1]:
        try:
            text = config_path(target.path).read_text()
        except OSError:
            return None
        match = re.search(r"^  slurm_version: '?([0-9.]+)'?$", text, re.M)
        return match.group(1) if match else None
    return None
