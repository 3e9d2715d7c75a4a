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

    RUN is a run id, an id prefix, SWEEP/<i> (a sweep's member) or a run directory.
    """
    from ddlaunch.app.logs import find_logs

    found = find_logs(run, rank=rank, batch=batch)
    if found.failure is not None:
        click.echo(f"FAILED {found.failure.one_line()}")
        if found.failure.traceback:
            click.echo(found.failure.traceback.rstrip())
    for path in found.paths:
        if path.exists():
            click.echo(f"==> {path} <==")
            text = tail(path, lines)
            if text:
                click.echo(text)
    if found.missing and not follow_:
        click.echo(found.missing, err=True)
    if follow_ and found.paths:
        with contextlib.suppress(KeyboardInterrupt):
            follow(found.paths)
