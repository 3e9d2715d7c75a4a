"""The overview's sweep rows (pure): a sweep's members folded into one row, with one state
(the liveliest member's, else how they all ended) and its members per state; the rows in the
order they were submitted. ``app.pipeline_status`` folds a pipeline's stages the same way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ddlaunch.app.status import RunStatus


def group_sweeps(rows: Sequence[RunStatus]) -> list[RunStatus]:
    """Overview form: one row per sweep (its members per state), runs unchanged, in the
    order they were submitted (a sweep: its first member's submission)."""
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
    return by_submission(out)


def by_submission(rows: Sequence[RunStatus]) -> list[RunStatus]:
    """Oldest first, the newest next to the prompt; runs without a time first."""
    return sorted(rows, key=lambda r: (r.submitted is not None, r.submitted or 0.0))


# A sweep's one state: the liveliest of its members', else how all of them ended.
_SWEEP_PRECEDENCE = ("RUNNING", "PENDING", "SUSPENDED")


def sweep_state(counts: Counter[str]) -> str:
    for state in _SWEEP_PRECEDENCE:
        if counts.get(state):
            return state
    if len(counts) == 1:
        return next(iter(counts))
    unfinished = [(n, s) for s, n in counts.items() if s != "COMPLETED"]
    return max(unfinished)[1] if unfinished else "COMPLETED"


def sweep_row(sweep_id: str, members: Sequence[RunStatus]) -> RunStatus:
    counts = Counter(m.state for m in members)
    jobs = sorted({(m.job_id or "").split("_")[0] for m in members if m.job_id})
    times = [m.submitted for m in members if m.submitted is not None]
    shown = ", ".join(f"{n} {s}" for s, n in counts.most_common())
    return folded_row(
        sweep_id,
        path=str(Path(members[0].path).parent.parent) if members else "",
        jobs=jobs,
        state=sweep_state(counts) if members else "UNKNOWN",
        detail=f"sweep of {len(members)}: {shown} (ddlaunch status {sweep_id})",
        submitted=min(times) if times else None,
        members=counts,
    )


def folded_row(
    run_id: str,
    *,
    path: str,
    jobs: Sequence[str],
    state: str,
    detail: str,
    submitted: float | None,
    members: Counter[str],
    problems: Sequence[str] = (),
) -> RunStatus:
    """The overview's one row for runs folded together (a sweep's members, a pipeline's
    stages): their jobs, one state, the members per state in ``detail`` and ``members``; no
    step, attempt or failure of its own."""
    return RunStatus(
        run_id=run_id,
        path=path,
        job_id=",".join(jobs) or None,
        state=state,
        nodes="",
        reason="",
        step=None,
        checkpoint_step=None,
        attempts=None,
        failure=None,
        detail=detail,
        submitted=submitted,
        members=dict(members.most_common()),
        problems=list(problems),
    )
