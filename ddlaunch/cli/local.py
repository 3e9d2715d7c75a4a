"""What ``submit --local`` and ``resume --local`` print around the local run."""

from __future__ import annotations

from pathlib import Path

import click

from ddlaunch.config.schema import Config


def run_here(run_dir: Path, cfg: Config) -> None:
    from ddlaunch.app.local import run_locally

    done = run_locally(run_dir, cfg)
    line = done.summary_line()
    if line:
        click.echo(line)
    click.echo(f"completed in {done.seconds:.1f} s")
