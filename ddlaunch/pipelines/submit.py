"""``ddlaunch pipeline FILE``: every stage submitted as its own run, each after its
predecessors' runs (``submit --after``), the pipeline's record written before the first
sbatch and after each one.

Every stage's config is loaded and checked before anything is submitted, so a typo in the
last stage submits nothing; the file's mistakes and those of every stage's config are
reported together, in one error. A stage that is refused at its submission (its partition
check, sbatch) stops the pipeline there: the stages already submitted stay queued, and the
error names them, the ones left out and how to cancel them.
"""

from __future__ import annotations

import contextlib
import glob
import shutil
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app import events
from ddlaunch.app.submit_run import sbatch_missing, submit_run
from ddlaunch.config import slurm_target
from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.load import apply_overrides, load_tree
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError
from ddlaunch.pipelines.spec import PipelineFileError, PipelineSpec, Stage, read_pipeline_file
from ddlaunch.slurm.client import SlurmError
from ddlaunch.store.pipelines import (
    PIPELINE_COPY,
    StageRecord,
    new_pipeline_dir,
    write_pipeline,
)
from ddlaunch.store.rundir import DEFAULT_RUN_ROOT, chosen_run_root, is_run_dir


@dataclass(frozen=True)
class Checked:
    """A dry run: the file and every stage's config are sound."""

    name: str
    stages: int


@dataclass(frozen=True)
class Planned:
    """A dry run: one stage as it would be submitted."""

    stage: Stage


@dataclass(frozen=True)
class Started:
    """The pipeline's directory and record exist; its stages are submitted next."""

    pipeline_id: str
    path: Path
    stages: int
    width: int = 0  # the longest stage name: the stages' lines align on it


@dataclass(frozen=True)
class StageSubmitted:
    stage: Stage
    run_id: str
    run_dir: Path
    job_id: str | None


PipelineEvent = (
    Checked
    | Planned
    | Started
    | StageSubmitted
    | events.Warned
    | events.Noted
    | events.Excluding
    | events.CodeSnapshot
)


def stage_issues(spec: PipelineSpec) -> list[ConfigIssue]:
    """Every problem of every stage's config with its overrides, each under its stage
    (``stages.eval: nodes.count: ...``) with the file:line (or ``--set``) that set it."""
    issues = []
    for stage in spec.stages:
        try:
            loaded = load_tree(stage.config_path)
            apply_overrides(loaded, stage.overrides, dict(stage.origins))
            slurm_target.check(validate_tree(loaded))  # a stage is a Slurm job
        except ConfigError as exc:
            issues += [
                ConfigIssue(
                    f"stages.{stage.name}",
                    f"{issue.path or '(top level)'}: {issue.message}",
                    issue.where or stage.config_where or stage.where,
                )
                for issue in exc.issues
            ]
    return issues


def check_stages(spec: PipelineSpec) -> None:
    """Load and check every stage's config with its overrides: all problems at once."""
    issues = stage_issues(spec)
    if issues:
        raise PipelineFileError(issues)


def check_pipeline(file: str | Path, overrides: Sequence[str] = ()) -> PipelineSpec:
    """Read pipeline ``file`` (``overrides``: the command line's ``--set``, for every stage)
    and check every stage's config: the file's mistakes and the configs' in one error."""
    spec, issues = read_pipeline_file(file, overrides)
    issues += stage_issues(spec)
    if issues:
        raise PipelineFileError(issues)
    return spec


# Kubernetes has no dependency between JobSets: a JobSet's dependsOn orders the replicated
# jobs inside one JobSet (one predecessor, Ready or Complete), and the stages are runs of
# their own (their own run directory, attempts, requeues and resume), with :any edges too.
KUBERNETES_REFUSED = (
    "a pipeline runs on Slurm only: its stages wait for each other as Slurm jobs (sbatch "
    "--dependency), and Kubernetes has no wait of one JobSet for another (a JobSet's "
    "dependsOn orders the replicated jobs inside one JobSet); submit each stage with "
    "ddlaunch submit --target kubernetes once the stages it waits for are done"
)


def submit_pipeline(
    file: str | Path,
    *,
    dry_run: bool,
    run_root: str | None,
    force: bool,
    workdir: str,
    target: str = "slurm",
    overrides: Sequence[str] = (),
) -> Generator[PipelineEvent, None, None]:
    """Check the file and every stage's config (``overrides``, the command line's
    ``--set``, apply to every stage after its own ``set:``), then submit the stages."""
    if target != "slurm":
        raise UserError(KUBERNETES_REFUSED)
    spec = check_pipeline(file, overrides)
    if dry_run:
        yield Checked(spec.name, len(spec.stages))
        for stage in spec.stages:
            yield Planned(stage)
        return
    if sbatch_missing():
        raise UserError(
            "a pipeline's stages are Slurm jobs that wait for each other, and there is no "
            "sbatch on PATH here; run it from a login node of the cluster"
        )
    root = chosen_run_root(run_root, DEFAULT_RUN_ROOT)
    path = new_pipeline_dir(root, spec.name)
    shutil.copyfile(spec.path, path / PIPELINE_COPY)
    created = time.time()
    stages = [
        StageRecord(
            name=s.name,
            config=str(s.config_path),
            overrides=s.overrides,
            after=tuple(e.text for e in s.after),
        )
        for s in spec.stages
    ]

    def record() -> None:
        write_pipeline(path, spec.name, str(spec.path.absolute()), created, stages)

    record()
    yield Started(path.name, path, len(stages), max(len(s.name) for s in spec.stages))
    for i, stage in enumerate(spec.stages):
        after = [f"{stages_dir(stages, e.stage)}:{e.condition}" for e in stage.after]
        before = _runs_named(root, stage)
        try:
            accepted = yield from _submit_stage(stage, after, run_root, force, workdir)
        except (UserError, SlurmError) as exc:
            # A refused sbatch leaves its run directory (SUBMIT_FAILED, with the error):
            # it is the stage's, so that status shows the pipeline with it.
            left = sorted(_runs_named(root, stage) - before)
            if len(left) == 1:
                stages[i] = stages[i].updated(run_id=left[0].name, run_dir=str(left[0]))
                record()
            raise UserError(_stopped(path.name, stage, exc, stages, spec.stages[i + 1 :])) from None
        stages[i] = stages[i].updated(
            run_id=accepted.run_id, run_dir=str(accepted.run_dir), job_id=accepted.job_id
        )
        record()
        yield StageSubmitted(stage, accepted.run_id, accepted.run_dir, accepted.job_id)


def _runs_named(root: Path, stage: Stage) -> set[Path]:
    """The run directories under ``root`` that a run of ``stage`` may have created."""
    name = next(o for o in stage.overrides if o.startswith("job.name=")).partition("=")[2]
    return {p for p in root.glob(f"{glob.escape(name)}-*") if is_run_dir(p)}


def stages_dir(stages: Sequence[StageRecord], name: str) -> str:
    """The run directory of the submitted stage ``name`` (its predecessors come first)."""
    found = next(s for s in stages if s.name == name)
    assert found.run_dir is not None, f"stage {name} is submitted before its dependents"
    return found.run_dir


def _submit_stage(
    stage: Stage, after: Sequence[str], run_root: str | None, force: bool, workdir: str
) -> Generator[PipelineEvent, None, events.Accepted]:
    steps = submit_run(
        str(stage.config_path),
        stage.overrides,
        dry_run=False,
        local=False,
        run_root=run_root,
        force=force,
        workdir=workdir,
        after=after,
    )
    with contextlib.closing(steps):
        for event in steps:
            match event:
                case events.Accepted():
                    return event
                case events.Warned() | events.Noted() | events.Excluding():
                    yield event
                case events.CodeSnapshot():
                    yield event
                case _:
                    pass  # Submitting: nothing to say before each sbatch
    raise UserError(f"stage {stage.name}: the submission ended without a job")


def _stopped(
    pipeline_id: str,
    stage: Stage,
    exc: Exception,
    stages: Sequence[StageRecord],
    left: Sequence[Stage],
) -> str:
    submitted = [s for s in stages if s.job_id]
    lines = [f"stage {stage.name} was not submitted: {exc}"]
    if submitted:
        shown = ", ".join(f"{s.name} (run {s.run_id}, job {s.job_id})" for s in submitted)
        lines.append(f"submitted before it, and still queued: {shown}")
    names = [stage.name, *(s.name for s in left)]
    lines.append(f"not submitted: {', '.join(names)}")
    if submitted:
        lines.append(f"cancel what was submitted with: ddlaunch cancel {pipeline_id}")
    return "\n".join(lines)
