"""``ddlaunch resume``: resubmit a run from its latest complete checkpoint."""

from __future__ import annotations

import contextlib

import click

from ddlaunch.cli.completion import complete_runs
from ddlaunch.cli.options import force_option, set_option


@click.command("resume")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    help="Resume on this many nodes (DCP reshards on load).",
)
@set_option
@click.option("--local", is_flag=True, help="Resume as local processes instead of on Slurm.")
@click.option("--dry-run", is_flag=True, help="Print the script and sbatch argv only.")
@force_option
def command(
    run: str,
    nodes: int | None,
    overrides: tuple[str, ...],
    local: bool,
    dry_run: bool,
    force: bool,
) -> None:
    """Resubmit RUN (finished, failed or cancelled; an id, an id prefix, SWEEP/<i> or a run
    directory) in its own run directory.

    The job restores the latest *complete* checkpoint (DCP metadata and commit marker both
    present), so `--nodes` may differ from the original node count. `--set` changes any
    key, e.g. `--set params.steps=600` to train further (a run at its last step is refused
    without it). Discovery needs no torch. One resume of a run at a time: a second one
    fails with "already being resumed". Runs submitted `--after RUN` that still wait for
    it are moved onto its new job (one line each).
    """
    from ddlaunch.app import events
    from ddlaunch.app.resume_run import ResumeDryRun, Resuming, resume_run
    from ddlaunch.cli.local import NO_SBATCH

    steps = resume_run(run, overrides, nodes, local=local, dry_run=dry_run, force=force)
    # Closed at once when a step here raises or exits (a local run's Ctrl-C): the run's
    # lock is let go then, not when the traceback is freed.
    with contextlib.closing(steps):
        for event in steps:
            match event:
                case events.Warned(text=text):
                    click.echo(f"warning: {text}", err=True)
                case events.Excluding(line=line):
                    click.echo(line, err=True)
                case ResumeDryRun(script=script, sbatch_line=sbatch_line, origin=origin):
                    click.echo(script, nl=False)
                    click.echo(f"# resumes from {origin}")
                    click.echo(f"# sbatch argv: {sbatch_line}")
                case Resuming(run_id=run_id, origin=origin):
                    click.echo(f"resuming {run_id} from {origin}")
                case events.RunsLocally(asked=asked):
                    if not asked:
                        click.echo(NO_SBATCH, err=True)
                case events.LocalRun(run_dir=run_dir, config=cfg):
                    from ddlaunch.cli.local import run_here

                    run_here(run_dir, cfg)
                case events.Accepted(run_id=run_id, run_dir=run_dir, job_id=job_id):
                    click.echo(f"run {run_id}  job {job_id}")
                    click.echo(f"run dir: {run_dir}")
                case events.Noted(line=line):
                    click.echo(line)
