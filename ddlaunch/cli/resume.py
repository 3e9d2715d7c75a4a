"""``ddlaunch resume``: resubmit a run from its latest complete checkpoint."""

from __future__ import annotations

import os
import shutil

import click

from ddlaunch.cli.completion import complete_runs
from ddlaunch.cli.options import set_option


@click.command("resume")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--nodes", type=int, help="Resume on this many nodes (DCP reshards on load).")
@set_option
@click.option("--local", is_flag=True, help="Resume as local processes instead of on Slurm.")
@click.option("--dry-run", is_flag=True, help="Print the script and sbatch argv only.")
def command(
    run: str, nodes: int | None, overrides: tuple[str, ...], local: bool, dry_run: bool
) -> None:
    """Resubmit RUN (finished, failed or cancelled) in its own run directory.

    The job restores the latest *complete* checkpoint (DCP metadata and commit marker both
    present), so `--nodes` may differ from the original node count. `--set` changes any
    key, e.g. `--set params.steps=600` to train further. Discovery needs no torch.
    """
    from ddlaunch.app.resume import prepare_resume, refuse_if_active, rewrite

    resumption = prepare_resume(run, overrides, nodes)
    prepared, info = resumption.prepared, resumption.info
    if dry_run:
        click.echo(prepared.script, nl=False)
        click.echo(f"# resumes from {resumption.origin}")
        return
    here = local or shutil.which("sbatch") is None
    if not here:
        from ddlaunch.slurm.client import SlurmClient

        refuse_if_active(info, SlurmClient())
    rewrite(resumption)
    click.echo(f"resuming {info.run_id} from {resumption.origin}")
    if here:
        from ddlaunch.cli.local import run_here

        run_here(resumption.run_dir.path, prepared.config)
        return
    from ddlaunch.app.submit import submit_to_slurm

    submitted = submit_to_slurm(prepared, workdir=os.getcwd(), run_dir=resumption.run_dir)
    click.echo(f"run {submitted.run_id}  job {submitted.job_id}")
