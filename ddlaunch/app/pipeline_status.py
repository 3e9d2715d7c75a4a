"""A pipeline in ``status`` and ``cancel``: its id (or directory, or a unique id prefix)
names the runs of its submitted stages, and the overview shows it as one row, its stages
with their states.

The stages are ordinary runs, read as any run is; the pipeline's record
(``store.pipelines``) only says which runs are its stages.
"""

from __future__ import annotations

import glob
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ddlaunch.app.status import RunStatus
from ddlaunch.app.sweep_rows import folded_row, sweep_state
from ddlaunch.errors import UserError
from ddlaunch.store.pipelines import PipelineRecord, is_pipeline_dir, read_pipeline
from ddlaunch.store.rundir import is_run_dir


def find_pipeline(ref: str, root: Path, *, prefix: bool) -> PipelineRecord | None:
    """The pipeline ``ref`` names: its directory or its id under ``root`` (``prefix``: or
    a unique prefix of one pipeline's id); None when it names no pipeline."""
    for candidate in (Path(ref).expanduser(), root / ref):
        if is_pipeline_dir(candidate):
            return read_pipeline(candidate.absolute())
    if not prefix or "/" in ref or not root.is_dir():
        return None
    matches = sorted(p for p in root.glob(f"{glob.escape(ref)}*") if is_pipeline_dir(p))
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches[:5])
        raise UserError(f"{ref!r} matches {len(matches)} pipelines ({names}); give more of the id")
    return read_pipeline(matches[0]) if matches else None


def stage_targets(pipeline: PipelineRecord) -> list[Path]:
    """The run directories of the stages submitted so far, in the pipeline's order; a
    pipeline none of whose stages was submitted is said so."""
    found = [Path(s.run_dir) for s in pipeline.stages if s.run_dir and is_run_dir(Path(s.run_dir))]
    if not found:
        raise UserError(
            f"pipeline {pipeline.pipeline_id}: none of its stages was submitted "
            f"({', '.join(not_submitted(pipeline)) or 'no stages'}); see {pipeline.path}"
        )
    return found


def stage_dirs(pipeline: PipelineRecord) -> list[Path]:
    """The run directories of the stages submitted so far, in the pipeline's order."""
    return [Path(s.run_dir) for s in pipeline.stages if s.run_dir]


def not_submitted(pipeline: PipelineRecord) -> list[str]:
    return [s.name or "?" for s in pipeline.stages if not s.run_dir]


def group_pipelines(rows: Sequence[RunStatus], pipelines: Sequence[Path]) -> list[RunStatus]:
    """Overview form: the rows of a pipeline's stages become one row, where its first
    stage's row was (the rows come in submission order)."""
    records = [r for r in (read_pipeline(p) for p in pipelines) if r is not None]
    owner: dict[str, PipelineRecord] = {}
    for record in records:
        for stage_dir in stage_dirs(record):
            owner[str(stage_dir)] = record
    if not owner:
        return list(rows)
    out: list[RunStatus] = []
    placed: set[str] = set()
    stage_rows: dict[str, list[RunStatus]] = {}
    for row in rows:
        found = owner.get(row.path)
        if found is None:
            out.append(row)
            continue
        stage_rows.setdefault(found.pipeline_id, []).append(row)
        if found.pipeline_id not in placed:
            placed.add(found.pipeline_id)
            out.append(row)  # replaced below
    by_id = {r.pipeline_id: r for r in records}
    for i, row in enumerate(out):
        first = owner.get(row.path)
        if first is not None and row is stage_rows[first.pipeline_id][0]:
            out[i] = pipeline_row(by_id[first.pipeline_id], stage_rows[first.pipeline_id])
    return out


def pipeline_row(pipeline: PipelineRecord, stages: Sequence[RunStatus]) -> RunStatus:
    """One row: the liveliest stage's state (else how they all ended), and each stage with
    its state in the note."""
    by_dir = {row.path: row for row in stages}
    shown = []
    counts: Counter[str] = Counter()
    for stage in pipeline.stages:
        row = by_dir.get(stage.run_dir or "")
        state = row.state if row is not None else "NOT SUBMITTED" if not stage.run_dir else ""
        if not state:
            continue  # a stage the overview hides (ended long ago)
        counts[state] += 1
        shown.append(f"{stage.name} {state}")
    jobs = [r.job_id for r in stages if r.job_id]
    times = [r.submitted for r in stages if r.submitted is not None]
    live = Counter({s: n for s, n in counts.items() if s != "NOT SUBMITTED"})
    return folded_row(
        pipeline.pipeline_id,
        path=str(pipeline.path),
        jobs=jobs,
        state=sweep_state(live) if live else "UNKNOWN",
        detail=(
            f"pipeline of {len(pipeline.stages)}: {', '.join(shown)} "
            f"(ddlaunch status {pipeline.pipeline_id})"
        ),
        submitted=min(times) if times else pipeline.created,
        members=counts,
        problems=[f"pipeline.json: {p}" for p in pipeline.problems],
    )
