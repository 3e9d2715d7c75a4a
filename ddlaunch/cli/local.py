"""What ``submit --local`` and ``resume --local`` print around the local run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ddlaunch.config.schema import Config


def _told() -> None:
    click.echo(
        "interrupted: the ranks save at their next step and stop (Ctrl-C again kills them)",
        err=True,
    )


def run_here(run_dir: Path, cfg: Config) -> None:
    """The same lines for ``submit --local`` and ``resume --local``: where the run runs,
    then its result and how long it took (or how it was interrupted)."""
    from ddlaunch.app.local import Interrupted, run_locally

    click.echo(f"run dir: {run_dir}  local, {cfg.world_size} ranks")
    try:
        done = run_locally(run_dir, cfg, on_interrupt=_told)
    except Interrupted as exc:
        click.echo(str(exc), err=True)  # "interrupted, saved step 109": not an error
        sys.exit(exc.exit_code)
    line = done.summary_line()
    if line:
        click.echo(line)
    click.echo(f"completed in {done.seconds:.1f} s")
