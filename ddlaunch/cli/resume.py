"""``ddlaunch resume``: resubmit a run from its latest complete checkpoint."""

from __future__ import annotations

import os
import shutil

import click

from ddlaunch.cli.completion import complete_runs
from ddlaunch.cli.options import set_option


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
def command(
    run: str, nodes: int | None, overrides: tuple[str, ...], local: bool, dry_run: bool
) -> None:
    """Resubmit RUN (finished, failed or cancelled; an id, an id prefix, SWEEP/<i> or a run
    directory) in its own run directory.

    The job restores the latest *complete* checkpoint (DCP metadata and commit marker both
    present), so `--nodes` may differ from the original node count. `--set` changes any
    key, e.g. `--set params.steps=600` to train further (a run at its last step is refused
    without it). Discovery needs no torch.
    """
    from ddlaunch.app.resume import prepare_resume, refuse_if_active, rewrite
    from ddlaunch.planning.plan import format_argv

    resumption = prepare_resume(run, overrides, nodes)
    prepared, info = resumption.prepared, resumption.info
    excluding = resumption.exclusion_line()
    if excluding:
        click.echo(excluding, err=True)
    if dry_run:
        click.echo(prepared.script, nl=False)
        click.echo(f"# resumes from {resumption.origin}")
        click.echo(f"# sbatch argv: {format_argv(prepared.plan.sbatch_argv)}")
        return
    here = local or shutil.which("sbatch") is None
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
