"""What ``sweep resubmit`` checks before it submits members again (login node)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ddlaunch.app.resume import refuse_if_done
from ddlaunch.app.runs import read_run
from ddlaunch.store.layout import MEMBERS_DIR
from ddlaunch.store.rundir import is_run_dir


def check_completed(
    sweep_dir: Path, rows: Sequence[Any], configs: Sequence[Any], overrides: Sequence[str]
) -> Iterator[str]:
    """A COMPLETED member named by hand: refused when it would train nothing (its final
    checkpoint is at params.steps, as ``resume`` refuses a run), else a line saying that it
    runs again and from where."""
    for row, cfg in zip(rows, configs, strict=True):
        if row.state != "COMPLETED":
            continue
        run = sweep_dir / MEMBERS_DIR / str(row.index)
        if not is_run_dir(run):
            continue
        info = read_run(run)
        again = f"ddlaunch sweep resubmit {sweep_dir.name} --member {row.index}"
        refuse_if_done(info, run, cfg, overrides, again=again)
        origin = f"step {info.latest_step}" if info.latest_step is not None else "scratch"
        yield f"member {row.index} had COMPLETED; it runs again, from {origin}"
