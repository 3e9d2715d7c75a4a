"""``ddlaunch submit``: create a run directory and submit (or run locally)."""

from __future__ import annotations

import os
import shutil

import click

from ddlaunch.cli.options import config_argument, set_option


def bad_node_exclusions() -> list[str]:
    """Active entries of my bad-node list that are safe to put in an #SBATCH line."""
    from ddlaunch.config.schema import PATTERNS
    from ddlaunch.health import badnodes

    pattern, _ = PATTERNS["slurm_token"]
    return [n for n in badnodes.active_nodes() if pattern.match(n)]


@click.command("submit")
@config_argument
@set_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the script and the exact sbatch argv; create and submit nothing.",
)
@click.option(
    "--local",
    is_flag=True,
    help="Run the ranks as local processes instead of on Slurm (the default when "
    "no sbatch is on PATH).",
)
@click.option("--run-root", help="Create the run directory under this folder.")
def command(
    config: str, overrides: tuple[str, ...], dry_run: bool, local: bool, run_root: str | None
) -> None:
    """Submit CONFIG to Slurm and print the run id and job id.

    CONFIG is a YAML file or a shipped preset name such as examples/mlp. The run directory
    (mode 0700) keeps the resolved config, the script, the git state and the job ids.
    `submit` returns as soon as sbatch has accepted the job.
    """
    from ddlaunch.plan import format_argv
    from ddlaunch.prepare import prepare

    workdir = os.getcwd()
    exclude = bad_node_exclusions()
    prepared = prepare(config, overrides, run_root=run_root, workdir=workdir, exclude=exclude)
    wanted = set(prepared.config.nodes.nodelist) & set(exclude)
    if wanted:
        # Nodes the config asks for by name win over the bad-node list (excluding them
        # would make the job unschedulable).
        exclude = [n for n in exclude if n not in wanted]
        prepared = prepare(config, overrides, run_root=run_root, workdir=workdir, exclude=exclude)
    if exclude:
        click.echo(f"excluding {','.join(exclude)} (bad-node list: ddlaunch nodes)", err=True)
    if dry_run:
        click.echo(prepared.script, nl=False)
        click.echo(f"# sbatch argv: {format_argv(prepared.plan.sbatch_argv)}")
        return
    if local or shutil.which("sbatch") is None:
        if not local:
            click.echo("no sbatch on PATH: running the ranks locally (--local)", err=True)
        from ddlaunch.launch.run_local import submit_local

        submit_local(prepared, workdir=workdir)
        return
    from ddlaunch.submit import submit_to_slurm

    submitted = submit_to_slurm(prepared, workdir=workdir)
    click.echo(f"run {submitted.run_id}  job {submitted.job_id}")
    click.echo(f"run dir: {submitted.run_dir}")
