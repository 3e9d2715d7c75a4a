"""``ddlaunch cancel``: cancel runs' and sweeps' Slurm jobs and say what that did."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ddlaunch.cli.completion import complete_runs
from ddlaunch.wording import counted

if TYPE_CHECKING:
    from ddlaunch.app.cancel import Waiting


def _jobs(jobs: tuple[str, ...]) -> str:
    return f"job {jobs[0]}" if len(jobs) == 1 else counted(len(jobs), "job")


def waiting_line(w: Waiting) -> str:
    """What the wait is for: started jobs stop once their ranks saved (a trainer that saves
    on no SIGTERM keeps its last checkpoint); a job that never started has no ranks, it only
    leaves the queue."""
    if w.unsaved and len(w.unsaved) == len(w.started):
        why = "its trainer saves on no cancel: its last checkpoint is kept"
        stop = f"to stop ({why if len(w.started) == 1 else why.replace('its', 'their', 1)})"
    elif w.unsaved:
        stop = f"to stop (the ranks save first; not {_jobs(w.unsaved)}, whose trainer does not)"
    else:
        stop = "to stop (the ranks save first)"
    if not w.queued:
        return f"waiting for {_jobs(w.started)} {stop}..."
    if not w.started:
        return f"waiting for {_jobs(w.queued)} to leave the queue..."
    return f"waiting for {_jobs(w.started)} {stop} and {_jobs(w.queued)} to leave the queue..."


def tell_waiting(w: Waiting) -> None:
    click.echo(waiting_line(w), err=True)


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
@click.option(
    "--component",
    metavar="NAME",
    help="Stop only this service component of RUN (a heterogeneous job); the job goes on.",
)
def command(runs: tuple[str, ...], wait_s: float, component: str | None) -> None:
    """Cancel RUNs (ids, id prefixes, SWEEP/<i> or run directories) and SWEEPs (every member
    that has not ended). All are looked up first: an unknown one cancels nothing. The run
    directory is kept, so `ddlaunch resume` can continue from the latest complete
    checkpoint; a run that has ended is left alone. With --component, stop one service of
    one RUN's components instead: its supervisor ends it and does not start it again, and
    the training goes on."""
    if component is not None:
        if len(runs) != 1:
            raise click.UsageError("--component stops a service of one RUN: name one run")
        from ddlaunch.app.cancel_component import cancel_component

        click.echo(cancel_component(runs[0], component))
        return
    from ddlaunch.app.cancel import cancel

    for line in cancel(runs, wait_s=wait_s, waiting=tell_waiting):
        click.echo(line)
