"""``ddlaunch resume``: resubmit a run from its latest complete checkpoint."""

from __future__ import annotations

import os
import shutil
from typing import Any

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
    fails with "already being resumed".
    """
    from ddlaunch.app.resume import prepare_resume, refuse_if_active, resuming, rewrite
    from ddlaunch.planning.plan import format_argv

    here = local or shutil.which("sbatch") is None
    if dry_run:
        resumption = prepare_resume(run, overrides, nodes)
        _say_excluding(resumption)
        click.echo(resumption.prepared.script, nl=False)
        click.echo(f"# resumes from {resumption.origin}")
        click.echo(f"# sbatch argv: {format_argv(resumption.prepared.plan.sbatch_argv)}")
        return
    facts = None
    if not here:
        from ddlaunch.app.facts import probe

        facts, warnings = probe()
        for line in warnings:
            click.echo(f"warning: {line}", err=True)
    with resuming(run) as path:
        resumption = prepare_resume(str(path), overrides, nodes, facts=facts, force=force)
        for line in resumption.warnings:
            click.echo(f"warning: {line}", err=True)
        _say_excluding(resumption)
        prepared, info = resumption.prepared, resumption.info
        if not here:
            from ddlaunch.slurm.client import SlurmClient

            refuse_if_active(info, SlurmClient())
        rewrite(resumption)
        click.echo(f"resuming {info.run_id} from {resumption.origin}")
        if here:
            from ddlaunch.cli.local import run_here

            if not local:
                click.echo("no sbatch on PATH: running the ranks locally (--local)", err=True)
            run_here(resumption.run_dir.path, prepared.config)
            return
        from ddlaunch.app.submit import submit_to_slurm

        submitted = submit_to_slurm(prepared, workdir=os.getcwd(), run_dir=resumption.run_dir)
        click.echo(f"run {info.run_id}  job {submitted.job_id}")
        click.echo(f"run dir: {submitted.run_dir}")


def _say_excluding(resumption: Any) -> None:
    excluding = resumption.exclusion_line()
    if excluding:
        click.echo(excluding, err=True)
