"""``ddlaunch pipeline FILE``: submit a pipeline's stages, each after its predecessors."""

from __future__ import annotations

import contextlib
import os
import shlex

import click

from ddlaunch.cli.options import force_option, set_option, target_option
from ddlaunch.cli.snapshot import echo_progress
from ddlaunch.wording import counted


@click.command("pipeline")
@click.argument("file", metavar="FILE", type=click.Path(dir_okay=False))
@set_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the file and every stage's config, print the stages in the order they "
    "would be submitted; create and submit nothing.",
)
@click.option("--run-root", help="Create the pipeline's and its stages' directories here.")
@force_option
@target_option
def command(
    file: str,
    overrides: tuple[str, ...],
    dry_run: bool,
    run_root: str | None,
    force: bool,
    target: str,
) -> None:
    """Submit the stages of pipeline FILE: each stage is a run of its own, submitted
    after the runs of the stages it names in after: (as `submit --after`).

    \b
        name: train-eval
        stages:
          train:
            config: train.yaml        # next to FILE, or a preset
            set: {params.steps: 200}
          eval:
            config: eval.yaml
            after: train              # STAGE[:ok|:any|:started]
          export:
            config: export.yaml
            after: [train]

    A stage's run gets the stage's name as job.name, so a dependent's ranks find its run
    directory in $DDLAUNCH_AFTER_<STAGE>_DIR (eval: $DDLAUNCH_AFTER_TRAIN_DIR). `--set`
    applies to every stage's config, after the stage's own set: (the command line wins);
    it may not set job.name. The file and every stage's config are checked before the
    first sbatch, all their mistakes reported in one error. `ddlaunch status PIPELINE`
    shows its stages, `ddlaunch cancel PIPELINE` cancels them, and `ddlaunch resume` of a
    stage moves its dependents onto the new job. Slurm only: --target kubernetes is refused
    (Kubernetes has no wait of one JobSet for another).
    """
    from ddlaunch.pipelines.submit import (
        Checked,
        Planned,
        StageSubmitted,
        Started,
        submit_pipeline,
    )

    steps = submit_pipeline(
        file,
        dry_run=dry_run,
        run_root=run_root,
        force=force,
        workdir=os.getcwd(),
        target=target,
        overrides=overrides,
    )
    width = 0  # the stage names' (Started says it)
    with contextlib.closing(steps):
        for event in steps:
            if echo_progress(event):
                continue
            match event:
                case Checked(name=name, stages=count):
                    click.echo(
                        f"pipeline {name}: {counted(count, 'stage')}, submitted in this order"
                    )
                case Planned(stage=stage):
                    sets = " ".join(f"--set {shlex.quote(o)}" for o in stage.overrides)
                    after = ", ".join(e.text for e in stage.after) or "-"
                    click.echo(f"stage {stage.name}: {shlex.quote(str(stage.config_path))} {sets}")
                    click.echo(f"  after: {after}")
                case Started(pipeline_id=pipeline_id, path=path, stages=count, width=width):
                    click.echo(f"pipeline {pipeline_id}: {counted(count, 'stage')}")
                    click.echo(f"pipeline dir: {path}")
                case StageSubmitted(stage=stage, run_id=run_id, job_id=job_id):
                    after = ", ".join(e.text for e in stage.after)
                    shown = f"  (after {after})" if after else ""
                    name = stage.name.ljust(width)  # the runs' ids line up
                    click.echo(f"stage {name}  run {run_id}  job {job_id}{shown}")
    if dry_run:
        click.echo("# nothing submitted (--dry-run)")
