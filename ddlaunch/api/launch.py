"""``render`` and ``submit``: the config -> plan -> script path of ``ddlaunch render`` and
``ddlaunch submit`` (``app.prepare``, ``app.submit``, ``app.local``), with what the CLI
prints on stderr returned as warnings instead."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from ddlaunch.api.run import Run, _no_sbatch, _run_here
from ddlaunch.api.values import DryRun
from ddlaunch.wording import counted

if TYPE_CHECKING:
    from ddlaunch.app.prepare import Submission

Target = Literal["slurm", "kubernetes"]


def render(
    config: str | os.PathLike[str],
    set: Sequence[str] = (),
    target: Target = "slurm",
    *,
    run_id: str | None = None,
    run_root: str | os.PathLike[str] | None = None,
) -> str:
    """The batch script ``config`` renders to, exactly as ``ddlaunch render`` prints it
    (``target="kubernetes"``: the manifest). Nothing is created or submitted.

    ``config`` is a YAML file or a shipped preset name such as ``examples/mlp``; ``set``
    holds ``key.path=value`` overrides. ``run_id`` makes the output stable (a fresh id
    otherwise); ``run_root`` renders as if the run lived there. A bad config raises
    ``ConfigError``, whose message names the file, the line and the key.
    """
    root = str(run_root) if run_root is not None else None
    if target == "kubernetes":
        from ddlaunch.app.kubernetes import prepare_objects

        objects = prepare_objects(str(config), tuple(set), run_id=run_id, run_root=root)
        return objects.manifest
    if target != "slurm":
        from ddlaunch.errors import UserError

        raise UserError(f"target must be slurm or kubernetes, got {target!r}")
    from ddlaunch.app.prepare import prepare_submission

    # Offline, as `render`: the snapshot is named, not stored; no partition checks.
    submission = prepare_submission(
        str(config), tuple(set), run_root=root, run_id=run_id, snapshot="path", check=False
    )
    return submission.prepared.script


@overload
def submit(
    config: str | os.PathLike[str],
    set: Sequence[str] = (),
    *,
    local: bool = False,
    run_root: str | os.PathLike[str] | None = None,
    dry_run: Literal[False] = False,
    force: bool = False,
) -> Run: ...


@overload
def submit(
    config: str | os.PathLike[str],
    set: Sequence[str] = (),
    *,
    local: bool = False,
    run_root: str | os.PathLike[str] | None = None,
    dry_run: Literal[True],
    force: bool = False,
) -> DryRun: ...


def submit(
    config: str | os.PathLike[str],
    set: Sequence[str] = (),
    *,
    local: bool = False,
    run_root: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> Run | DryRun:
    """Submit ``config`` to Slurm, as ``ddlaunch submit``, and return the ``Run`` as soon as
    sbatch has accepted the job.

    Before sbatch the job is checked against its partition (one sinfo call) and what it
    runs; one that could never run raises ``UserError`` and nothing is created (``force``
    submits it anyway). ``local``: run the ranks on this machine instead and return when
    they are done (a failing rank raises ``UserError``, after the run recorded it).
    Without ``local``, a machine with no ``sbatch`` raises ``UserError``. ``dry_run``:
    create and submit nothing; returns the ``DryRun`` (script and sbatch argv) instead,
    after the same checks, where what ``submit`` would refuse is one of its ``warnings``.
    What ``submit`` prints as warnings is in ``Run.warnings``.
    """
    workdir = os.getcwd()
    root = str(run_root) if run_root is not None else None
    here = local or dry_run
    if not here and shutil.which("sbatch") is None:
        raise _no_sbatch("submit")
    warnings: list[str] = []
    facts = None
    # --local (or a dry run with no sbatch here) asks nothing of Slurm; a dry run probes as
    # submit does.
    if not local and shutil.which("sbatch") is not None:
        from ddlaunch.app.facts import probe

        facts, probed = probe()
        warnings += probed

    def prepare() -> Submission:
        from ddlaunch.app.prepare import prepare_submission

        return prepare_submission(
            str(config),
            tuple(set),
            run_root=root,
            workdir=workdir,
            facts=facts,
            force=force,
            snapshot="path" if dry_run else "store",
            dry_run=dry_run,
        )

    submission = prepare()
    prepared = submission.prepared
    warnings += submission.warnings
    if submission.excluded:
        from ddlaunch.app.prepare import excluding_line

        warnings.append(excluding_line(submission.excluded))
    warnings += _snapshot_warnings(submission)
    warnings += prepared.plan.warnings
    if facts is not None:
        from ddlaunch.app.submit import stop_window_warnings

        warnings += stop_window_warnings(prepared)
    if dry_run:
        plan = prepared.plan
        return DryRun(
            run_id=plan.run_id,
            run_dir=Path(plan.run_dir),
            script=prepared.script,
            sbatch_argv=tuple(plan.sbatch_argv),
            warnings=tuple(warnings),
        )
    if local:
        from ddlaunch.app.submit import create_run_dir
        from ddlaunch.runner import SubprocessRunner

        run_dir = create_run_dir(prepared, SubprocessRunner(), workdir)
        _run_here(run_dir.path, prepared)
        return Run._at(run_dir.path, warnings)
    from ddlaunch.app.submit import submit_to_slurm

    submitted = submit_to_slurm(prepared, workdir=workdir, reprepare=lambda: prepare().prepared)
    return Run._at(submitted.run_dir, warnings)


def _snapshot_warnings(submission: Submission) -> list[str]:
    """What ``submit`` warns about the code snapshot: files it left out, an entry point
    outside it."""
    from ddlaunch.app.snapshot import live_entrypoint_warning

    snap = submission.prepared.snapshot
    if snap is None:
        return []
    out = []
    if snap.untracked:
        out.append(
            f"{counted(len(snap.untracked), 'untracked file')} not in the snapshot "
            f"({', '.join(snap.untracked[:3])}{', ...' if len(snap.untracked) > 3 else ''})"
        )
    warning = live_entrypoint_warning(submission.prepared.config, snap)
    if warning:
        out.append(warning)
    return out
