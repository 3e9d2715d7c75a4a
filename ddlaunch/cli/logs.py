"""``ddlaunch logs``: per-rank logs, the failing rank first."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import click


def tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:]) if lines else text


def follow(paths: list[Path], poll: float = 0.5) -> None:
    """Print what is appended to ``paths`` until interrupted (like tail -f)."""
    offsets = {p: p.stat().st_size if p.exists() else 0 for p in paths}
    while True:
        for p in paths:
            if not p.exists():
                continue
            size = p.stat().st_size
            if size < offsets[p]:
                offsets[p] = 0  # truncated
            if size > offsets[p]:
                with p.open("rb") as handle:
                    handle.seek(offsets[p])
                    sys.stdout.write(handle.read().decode(errors="replace"))
                    sys.stdout.flush()
                offsets[p] = size
        time.sleep(poll)


@click.command("logs")
@click.argument("run", metavar="RUN")
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
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new output.")
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
    shown = False
    for path in paths:
        if path.exists():
            click.echo(f"==> {path} <==")
            text = tail(path, lines)
            if text:
                click.echo(text)
            shown = True
    if not shown and not follow_:
        click.echo(f"no log yet in {run_dir / LOGS_DIR}", err=True)
    if follow_:
        with contextlib.suppress(KeyboardInterrupt):
            follow(paths)
