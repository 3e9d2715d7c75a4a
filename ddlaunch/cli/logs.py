"""``ddlaunch logs``: per-rank logs, the failing rank first."""

from __future__ import annotations

from pathlib import Path

import click

from ddlaunch.cli.completion import complete_runs


def tail(path: Path, lines: int, upto: int | None = None) -> str:
    """The last ``lines`` lines of ``path`` (0: all), of its first ``upto`` bytes if given."""
    try:
        with open(path, "rb") as handle:
            data = handle.read() if upto is None else handle.read(upto)
    except FileNotFoundError:
        return ""
    text = data.decode(errors="replace").splitlines()
    return "\n".join(text[-lines:] if lines else text)


@click.command("logs")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option("--rank", type=int, help="Show this rank's stdout and stderr.")
@click.option("--batch", is_flag=True, help="Show the batch script's own log.")
@click.option(
    "-n",
    "--lines",
    type=int,
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

    RUN is a run id, an id prefix or a run directory.
    """
    from ddlaunch.app.runs import find_run_materialized
    from ddlaunch.store.failures import read_failures
    from ddlaunch.store.rundir import LOGS_DIR, batch_logs, rank_log

    run_dir = find_run_materialized(run)
    if batch:
        paths = batch_logs(run_dir)[-1:]
    elif rank is not None:
        paths = [rank_log(run_dir, rank, "out"), rank_log(run_dir, rank, "err")]
    else:
        failures = read_failures(run_dir)
        if failures:
            first = failures[0]
            click.echo(f"FAILED {first.one_line()}")
            if first.traceback:
                click.echo(first.traceback.rstrip())
            paths = [rank_log(run_dir, first.rank, "err")]
        else:
            paths = [rank_log(run_dir, 0, "out"), rank_log(run_dir, 0, "err")]
    stream = None
    if follow_:
        from ddlaunch.app.follow import LogStream

        # Where following starts is fixed before the tail is read: no line is lost between
        # them, none shown twice. --batch: this batch log, and the next one a resume writes.
        stream = (
            LogStream(run_dir, ranks=(), from_start=False)
            if batch
            else LogStream(run_dir, paths=paths, from_start=False)
        )
    shown = False
    for path in paths:
        if path.exists():
            click.echo(f"==> {path} <==")
            text = tail(path, lines, stream.offset(path) if stream else None)
            if text:
                click.echo(text)
            shown = True
    if not shown and not follow_:
        click.echo(f"no log yet in {run_dir / LOGS_DIR}", err=True)
    if stream is not None:
        from ddlaunch.cli.follow import follow_run

        follow_run(run_dir, stream)
