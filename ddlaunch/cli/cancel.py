"""``ddlaunch cancel``: cancel runs' and sweeps' Slurm jobs and say what that did."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_runs


@click.command("cancel")
@click.argument(
    "runs", nargs=-1, required=True, metavar="RUN|SWEEP...", shell_complete=complete_runs
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the jobs to stop (the ranks save first); 0: do not wait.",
)
def command(runs: tuple[str, ...], wait_s: float) -> None:
    """Cancel RUNs (ids, id prefixes, SWEEP/<i> or run directories) and SWEEPs (every member
    that has not ended). All are looked up first: an unknown one cancels nothing. The run
    directory is kept, so `ddlaunch resume` can continue from the latest complete
    checkpoint; a run that has ended is left alone."""
    from ddlaunch.app.cancel import cancel

    def waiting(jobs: list[str]) -> None:
        what = f"job {jobs[0]}" if len(jobs) == 1 else f"{len(jobs)} jobs"
        click.echo(f"waiting for {what} to stop (the ranks save first)...", err=True)

    for line in cancel(runs, wait_s=wait_s, waiting=waiting):
        click.echo(line)
