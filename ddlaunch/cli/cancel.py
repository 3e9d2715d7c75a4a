"""``ddlaunch cancel``: cancel a run's Slurm job(s) and record that it was cancelled."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_runs


@click.command("cancel")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...", shell_complete=complete_runs)
def command(runs: tuple[str, ...]) -> None:
    """Cancel RUNs (ids, id prefixes or run directories). The run directory is kept, so
    `ddlaunch resume` can continue from the latest complete checkpoint."""
    from ddlaunch.app.runs import find_run_materialized, read_run
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.store.outcome import write_cancel

    client = SlurmClient()
    for ref in runs:
        info = read_run(find_run_materialized(ref))
        if not info.job_ids:
            click.echo(f"{info.run_id}: no job to cancel")
            continue
        # Recorded first, so the job's own requeue logic knows the stop was wanted.
        write_cancel(info.path, info.job_ids)
        client.cancel(info.job_ids)
        click.echo(f"{info.run_id}: cancelled job {', '.join(info.job_ids)}")
