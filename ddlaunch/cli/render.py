"""``ddlaunch render``: print the batch script (the same code path as submit, minus sbatch),
or with ``--target kubernetes`` the Kubernetes objects."""

from __future__ import annotations

import click

from ddlaunch.cli.options import config_argument, set_option, target_option


@click.command("render")
@config_argument
@set_option
@target_option
@click.option("--run-id", help="Use this run id instead of a fresh one (stable output).")
@click.option("--run-root", help="Render as if the run directory lived under this folder.")
def command(
    config: str,
    overrides: tuple[str, ...],
    target: str,
    run_id: str | None,
    run_root: str | None,
) -> None:
    """Print the sbatch script CONFIG renders to (or its Kubernetes manifest): the one
    `submit` would submit, with the nodes of my bad-node list excluded as `submit` excludes
    them.

    CONFIG is a YAML file or a shipped preset name such as examples/mlp.
    Nothing is created or submitted. A parallel: plan's placement and communication
    estimate and the data staging appear as comments; the plan's warnings on stderr.
    """
    if target == "kubernetes":
        from ddlaunch.app.kubernetes import prepare_objects

        objects = prepare_objects(config, overrides, run_id=run_id, run_root=run_root)
        click.echo(objects.manifest, nl=False)
        return
    from ddlaunch.app.prepare import excluding_line, prepare_submission

    # The script names the code snapshot a submit would store (nothing is written).
    # Offline: no checks (submit and submit --dry-run make them).
    submission = prepare_submission(
        config, overrides, run_root=run_root, run_id=run_id, snapshot="path", check=False
    )
    prepared, exclude = submission.prepared, submission.excluded
    if exclude:
        click.echo(excluding_line(exclude), err=True)
    for warning in prepared.plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(prepared.script, nl=False)
