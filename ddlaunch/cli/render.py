"""``ddlaunch render``: print the batch script (the same code path as submit, minus sbatch)."""

from __future__ import annotations

import click

from ddlaunch.cli.options import config_argument, set_option


@click.command("render")
@config_argument
@set_option
@click.option("--run-id", help="Use this run id instead of a fresh one (stable output).")
@click.option("--run-root", help="Render as if the run directory lived under this folder.")
def command(
    config: str, overrides: tuple[str, ...], run_id: str | None, run_root: str | None
) -> None:
    """Print the sbatch script CONFIG renders to: the one `submit` would submit, with the
    nodes of my bad-node list excluded as `submit` excludes them.

    CONFIG is a YAML file or a shipped preset name such as examples/mlp.
    Nothing is created or submitted. A parallel: plan's placement and communication
    estimate and the data staging appear as comments; the plan's warnings on stderr.
    """
    from ddlaunch.app.prepare import prepare_submission

    # The script names the code snapshot a submit would store (nothing is written).
    # Offline, as --dry-run: no partition checks (submit makes them).
    submission = prepare_submission(
        config, overrides, run_root=run_root, run_id=run_id, snapshot="path", check=False
    )
    prepared, exclude = submission.prepared, submission.excluded
    if exclude:
        click.echo(f"excluding {','.join(exclude)} (bad-node list: ddlaunch nodes)", err=True)
    for warning in prepared.plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(prepared.script, nl=False)
