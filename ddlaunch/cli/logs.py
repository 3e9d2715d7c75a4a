"""``ddlaunch logs``: per-rank logs, the failing rank first."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_runs


@click.command("logs")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--rank", type=int, help="Show this rank's stdout and stderr.")
@click.option("--batch", is_flag=True, help="Show the batch script's own log.")
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Lines from the end of each file; 0 for all.",
)
@click.option(
    "-f",
    "--follow",
    "follow_",
    is_flag=True,
    help="Keep printing new output, across requeues, until the run ends; exit 0 if it "
    "completed, 1 otherwise (Ctrl-C stops following, never the run).",
)
def command(run: str, rank: int | None, batch: bool, lines: int, follow_: bool) -> None:
    """Show a run's logs. Without --rank, a failed rank's error comes first, then its stderr.

    RUN is a run id, an id prefix, SWEEP/<i> (a sweep's member) or a run directory.
    """
    from ddlaunch.app.logs import find_logs, tail

    found = find_logs(run, rank=rank, batch=batch)
    run_dir, paths = found.run_dir, found.paths
    if found.headline is not None:
        click.echo(f"FAILED {found.headline}")
        if found.failure is not None and found.failure.traceback:
            click.echo(found.failure.traceback.rstrip())
    for line in found.history:
        click.echo(f"earlier: {line}")
    stream = None
    shown = (found.rank,) if found.rank is not None else None
    if follow_:
        from ddlaunch.app.follow import LogStream

        # Where following starts is fixed before the tail is read: no line is lost between
        # them, none shown twice. --batch: this batch log, and the next one a resume writes.
        stream = (
            LogStream(run_dir, ranks=(), from_start=False)
            if batch
            else LogStream(run_dir, ranks=shown, paths=paths, from_start=False)
        )
    for path in paths:
        if path.exists():
            click.echo(f"==> {path} <==")
            text = tail(path, lines, stream.offset(path) if stream else None, found.rank)
            if text:
                click.echo(text)
    if found.missing and not follow_:
        click.echo(found.missing, err=True)
    for problem in found.problems:
        click.echo(problem, err=True)
    if stream is not None:
        from ddlaunch.cli.follow import follow_run

        follow_run(run_dir, stream)
