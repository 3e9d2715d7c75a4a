"""``ddlaunch cancel``: cancel a run's Slurm job(s) and record that it was cancelled."""

from __future__ import annotations

import time

import click


@click.command("cancel")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
def command(runs: tuple[str, ...]) -> None:
    """Cancel RUNs (ids, id prefixes or run directories). The run directory is kept, so
    `ddlaunch resume` can continue from the latest complete checkpoint."""
    from ddlaunch import fsutil
    from ddlaunch.attempts import CANCEL_FILE
    from ddlaunch.runs import find_run, read_run
    from ddlaunch.slurm.client import SlurmClient

    client = SlurmClient()
    for ref in runs:
        info = read_run(find_run(ref))
        if not info.job_ids:
            click.echo(f"{info.run_id}: no job to cancel")
            continue
        # Recorded first, so the job's own requeue logic knows the stop was wanted.
        fsutil.atomic_write_json(
            info.path / CANCEL_FILE, {"time": time.time(), "job_ids": info.job_ids}, 0o600
        )
        client.cancel(info.job_ids)
        click.echo(f"{info.run_id}: cancelled job {', '.join(info.job_ids)}")
