"""What ``submit --local`` and ``resume --local`` print around the local run."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import click

from ddlaunch.config.schema import Config


def _stream_rank0(run_dir: Path, stop: threading.Event) -> None:
    """Rank 0's output as the local run goes (the follow engine, without Slurm)."""
    from ddlaunch.app.follow import LogStream, RunEnd, RunWatch, follow

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    class _Watch(RunWatch):
        # The outcome ends it; so does the local run returning without one (Ctrl-C).
        def ended(self) -> RunEnd | None:
            return super().ended() or (RunEnd("STOPPED") if stop.is_set() else None)

    follow(LogStream(run_dir, (0,), batch=False), _Watch(run_dir), write, poll_s=0.2)


def run_here(run_dir: Path, cfg: Config) -> None:
    from ddlaunch.app.local import run_locally

    stop = threading.Event()
    streamer = threading.Thread(target=_stream_rank0, args=(run_dir, stop), daemon=True)
    streamer.start()
    try:
        done = run_locally(run_dir, cfg)
    finally:
        stop.set()  # the outcome is written either way; this covers Ctrl-C
        streamer.join(timeout=10)
    line = done.summary_line()
    if line:
        click.echo(line)
    click.echo(f"completed in {done.seconds:.1f} s")
