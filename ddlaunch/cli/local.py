"""What ``submit --local`` and ``resume --local`` print around the local run."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import click

from ddlaunch.config.schema import Config
from ddlaunch.wording import counted

# Said when the ranks run here only because there is no sbatch (not --local).
NO_SBATCH = "no sbatch on PATH: running the ranks locally (--local)"


def _told(line: str) -> None:
    click.echo(line, err=True)  # who stopped the run, and how the ranks are stopped


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
    """The same lines for ``submit --local`` and ``resume --local``: where the run runs,
    rank 0's output as it goes, then its result and how long it took (or how it was
    interrupted)."""
    from ddlaunch.app.local import LocalRunInterrupted, run_locally

    click.echo(f"run dir: {run_dir}  local, {counted(cfg.world_size, 'rank')}")
    stop = threading.Event()
    streamer = threading.Thread(target=_stream_rank0, args=(run_dir, stop), daemon=True)
    streamer.start()
    try:
        done = run_locally(run_dir, cfg, on_interrupt=_told)
    except LocalRunInterrupted as exc:
        stop.set()
        streamer.join(timeout=10)
        # "cancelled by the user (Ctrl-C, SIGINT), saved step 109; ...": not an error
        click.echo(str(exc), err=True)
        sys.exit(exc.exit_code)
    finally:
        stop.set()  # the outcome is written either way; this covers everything else
        streamer.join(timeout=10)
    line = done.summary_line()
    if line:
        click.echo(line)
    click.echo(f"completed in {done.seconds:.1f} s")
