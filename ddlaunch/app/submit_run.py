"""``submit`` to Slurm as one use case: probe the cluster, prepare and check the run, then
print it (dry run), run it here (``--local``, or no sbatch on PATH) or submit it.

The steps come back as events (``app.events``) in the order they happen; the caller prints
each one and, for a ``LocalRun``, starts the local run itself (it streams rank 0's output).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ddlaunch.app import own_package
from ddlaunch.app.events import (
    Accepted,
    CodeSnapshot,
    DryRun,
    Excluding,
    LocalRun,
    Noted,
    RunsLocally,
    Submitting,
    Warned,
)
from ddlaunch.app.prepare import Prepared, Submission, excluding_line, prepare_submission
from ddlaunch.errors import UserError
from ddlaunch.policy import chain

if TYPE_CHECKING:
    from ddlaunch.app.chain import Chained
    from ddlaunch.planning.plan import ClusterFacts

SubmitEvent = (
    Warned
    | Noted
    | Excluding
    | CodeSnapshot
    | DryRun
    | RunsLocally
    | LocalRun
    | Submitting
    | Accepted
)


def sbatch_missing() -> bool:
    """No sbatch on PATH: the ranks run here instead."""
    return shutil.which("sbatch") is None


def submit_run(
    config: str,
    overrides: Sequence[str],
    *,
    dry_run: bool,
    local: bool,
    run_root: str | None,
    force: bool,
    workdir: str,
    after: Sequence[str] = (),
) -> Generator[SubmitEvent, None, None]:
    """Submit ``config`` (with ``overrides``) to Slurm, or print it (``dry_run``), or run it
    here (``local``, or no sbatch on PATH). A dry run makes the checks a submit makes, with
    the same probe of the cluster (which, as for submit, only warns when Slurm does not
    answer), and warns of what a submit would refuse instead of refusing it; it creates
    and submits nothing. ``after``: ``RUN[:ok|:any|:started]`` each (``policy.chain``)."""
    here = local or sbatch_missing()
    refs = _after_refs(after, here, local)
    facts, warnings = (None, []) if here else _probe()
    for line in warnings:
        yield Warned(line)
    with contextlib.ExitStack() as held:
        root = Path(run_root) if run_root else None
        chained = _chained(refs, held, lock=not dry_run, root=root)
        for line in chained.notes if chained is not None else ():
            yield Noted(line)

        def prepare() -> Submission:
            return prepare_submission(
                config,
                overrides,
                run_root=run_root,
                workdir=workdir,
                facts=facts,
                force=force,
                snapshot="path" if dry_run else "store",
                dry_run=dry_run,
                after=chained,
            )

        submission = prepare()
        for line in [*submission.warnings, *_start_directory(submission, here, workdir)]:
            yield Warned(line)
        prepared, exclude = submission.prepared, submission.excluded
        if exclude:
            yield Excluding(excluding_line(exclude))
        yield CodeSnapshot(prepared.config, prepared.snapshot, stored=not dry_run)
        for warning in prepared.plan.warnings:
            yield Warned(warning)
        if not here:
            from ddlaunch.app.submit import stop_window_warnings

            for warning in stop_window_warnings(prepared):
                yield Warned(warning)
        if dry_run:
            yield DryRun(prepared.script, prepared.sbatch_line)
            return
        if here:
            yield from _run_here(prepared, local, workdir)
            return
        from ddlaunch.app.submit import submit_to_slurm

        yield Submitting()
        done = submit_to_slurm(prepared, workdir=workdir, reprepare=lambda: prepare().prepared)
        for line in _record(chained, done.run_id, done.run_dir):
            yield Warned(line)
    # The predecessors' locks are let go before the caller follows the run (--follow).
    yield Accepted(done.run_id, done.run_dir, done.job_id)


def _start_directory(submission: Submission, here: bool, workdir: str) -> list[str]:
    """The batch script starts where sbatch runs, and local ranks without a snapshot start
    there too: a ddlaunch package there other than the submitting one is warned of."""
    if here and submission.prepared.snapshot is not None:
        return []
    shadow = own_package.in_start_directory(Path(workdir))
    return [shadow] if shadow is not None else []


def _after_refs(after: Sequence[str], here: bool, local: bool) -> list[chain.AfterRef]:
    """``--after`` parsed; refused where no Slurm job is submitted."""
    refs = chain.parse_all(after)
    if refs and here:
        why = "--local" if local else "no sbatch on PATH"
        raise UserError(f"--after chains Slurm jobs; it cannot be used here ({why})")
    return refs


def _record(chained: Chained | None, run_id: str, run_dir: Path) -> list[str]:
    if chained is None:
        return []
    from ddlaunch.app.chain import record_dependents

    return record_dependents(chained, run_id, run_dir)


def _chained(
    refs: Sequence[chain.AfterRef], held: contextlib.ExitStack, *, lock: bool, root: Path | None
) -> Chained | None:
    """The predecessors, each one's dependents lock held in ``held`` (``lock``: not for a
    dry run, which writes nothing) until the new run is recorded as its dependent; looked
    for under ``root`` (``--run-root``, where the new run goes too), else the default."""
    if not refs:
        return None
    from ddlaunch.app.chain import holding, locate, resolve
    from ddlaunch.slurm.client import SlurmClient

    paths = [locate(ref, root) for ref in refs]
    if lock:
        held.enter_context(holding(paths))
    return resolve(refs, paths, SlurmClient())


def _run_here(prepared: Prepared, asked: bool, workdir: str) -> Iterator[SubmitEvent]:
    from ddlaunch.app.submit import create_run_dir
    from ddlaunch.runner import SubprocessRunner

    yield RunsLocally(asked)
    run_dir = create_run_dir(prepared, SubprocessRunner(), workdir)
    yield LocalRun(prepared.plan.run_id, run_dir.path, prepared.config)


def _probe() -> tuple[ClusterFacts, list[str]]:
    from ddlaunch.app.facts import probe

    return probe()
