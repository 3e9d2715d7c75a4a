"""Following a run in the terminal (``logs -f``, ``submit --follow``): stream, final line, exit
status; Ctrl-C detaches and leaves the run alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from ddlaunch.app.follow import LogStream


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def follow_run(run_dir: Path, stream: LogStream, *, local: bool = False) -> NoReturn:
    """Follow until the run ends; exit with 0 if it completed, else 1 (130 on Ctrl-C)."""
    from ddlaunch.app.follow import follow, watch_run

    watch = watch_run(run_dir, local=local)
    sys.stdout.flush()  # what was printed before (the tail) comes first, also in a pipe
    try:
        end = follow(stream, watch, _write)
    except KeyboardInterrupt:
        click.echo(
            f"\n[ddlaunch] detached; run {run_dir.name} goes on "
            f"(ddlaunch logs -f {run_dir.name} to follow it again, ddlaunch cancel to stop it)",
            err=True,
        )
        sys.exit(130)
    click.echo(end.line(run_dir.name), err=True)
    sys.exit(end.exit_code)


def parse_ranks(text: str) -> tuple[int, ...] | None:
    """``--ranks``: ``all`` (None) or a comma-separated list of rank numbers."""
    if text.strip().lower() == "all":
        return None
    try:
        ranks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected all or rank numbers like 0,3; got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise click.BadParameter(f"expected all or rank numbers like 0,3; got {text!r}")
    return ranks
