"""``resume`` as one use case: the run's lock, its config again with the changes asked for,
the checks ``submit`` makes, the records rewritten, then a local run or sbatch. A dry run
takes no lock and changes nothing.

The steps come back as events (``app.events``) in order; the caller prints each one and, for
a ``LocalRun``, runs the ranks itself while the run's lock is still held (the generator is
paused inside it).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.events import (
    Accepted,
    DryRun,
    Excluding,
    LocalRun,
    Noted,
    RunsLocally,
    Warned,
)
from ddlaunch.app.resume import Resumption, prepare_resume, refuse_if_active, resuming, rewrite
from ddlaunch.app.submit_run import sbatch_missing


@dataclass(frozen=True)
class ResumeDryRun(DryRun):
    """What would be submitted, and from which checkpoint."""

    origin: str


@dataclass(frozen=True)
class Resuming:
    """The records are rewritten; the run goes on from ``origin``."""

    run_id: str
    origin: str


ResumeEvent = (
    Warned | Noted | Excluding | ResumeDryRun | Resuming | RunsLocally | LocalRun | Accepted
)


def _excluding(resumption: Resumption) -> Iterator[Excluding]:
    line = resumption.exclusion_line()
    if line:
        yield Excluding(line)


def resume_run(
    run: str,
    overrides: Sequence[str],
    nodes: int | None,
    *,
    local: bool,
    dry_run: bool,
    force: bool,
) -> Generator[ResumeEvent, None, None]:
    """Resubmit ``run`` from its latest complete checkpoint, in its own run directory (or
    run it here: ``local``, or no sbatch on PATH)."""
    here = local or sbatch_missing()
    if dry_run:
        resumption = prepare_resume(run, overrides, nodes)
        yield from _excluding(resumption)
        prepared = resumption.prepared
        yield ResumeDryRun(prepared.script, prepared.sbatch_line, resumption.origin)
        return
    facts = None
    if not here:
        from ddlaunch.app.facts import probe

        facts, warnings = probe()
        for line in warnings:
            yield Warned(line)
    with resuming(run) as path:
        resumption = prepare_resume(str(path), overrides, nodes, facts=facts, force=force)
        for line in resumption.warnings:
            yield Warned(line)
        yield from _excluding(resumption)
        prepared, info = resumption.prepared, resumption.info
        if not here:
            from ddlaunch.slurm.client import SlurmClient

            refuse_if_active(info, SlurmClient())
        rewrite(resumption)
        yield Resuming(info.run_id, resumption.origin)
        if here:
            yield RunsLocally(local)
            yield LocalRun(info.run_id, resumption.run_dir.path, prepared.config)
            return
        from ddlaunch.app.submit import submit_to_slurm

        submitted = submit_to_slurm(prepared, workdir=os.getcwd(), run_dir=resumption.run_dir)
        yield Accepted(info.run_id, submitted.run_dir, submitted.job_id)
        if submitted.job_id:
            yield from _move_dependents(submitted.run_dir, submitted.job_id)


def _move_dependents(run_dir: Path, job_id: str) -> Iterator[Noted | Warned]:
    """The runs submitted ``--after`` this one that still wait for one of its earlier
    jobs wait for ``job_id`` now; each move said, each failure a warning."""
    from ddlaunch.app.chain import Moved, move_dependents
    from ddlaunch.slurm.client import SlurmClient

    try:
        results = move_dependents(run_dir, job_id, SlurmClient())
    except OSError as exc:  # the resume itself happened: this is no failure of it
        yield Warned(f"could not read the dependents of {run_dir.name}: {exc}")
        return
    for result in results:
        yield Noted(result.line) if isinstance(result, Moved) else Warned(result.line)
