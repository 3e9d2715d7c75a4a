"""``ddlaunch status``: my runs, one run or a sweep, from the run directories plus one squeue
call per poll (``ddlaunch.app.status.poll``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

from ddlaunch.cli.completion import complete_targets


def _causes(history: Sequence[dict[str, Any]]) -> str:
    return ", ".join(str(a.get("cause")) for a in history)


COLUMNS = ("run", "job", "state", "nodes", "step", "ckpt", "attempts", "note")
# Above this many rows the table is plain aligned text: rich lays out every cell (folding,
# measuring) and takes seconds for a 1000-member sweep; plain text takes milliseconds.
RICH_MAX_ROWS = 100


def cells(r: Any) -> tuple[str, ...]:
    note = r.failure or r.detail or r.reason or ""
    if r.health:
        note = f"{note}; {r.health}" if note else r.health
    attempts = str(r.attempts)
    if len(r.history) > 1:
        attempts += f" ({_causes(r.history)})"
    return (
        r.run_id if not r.label else f"{r.run_id} {r.label}",
        r.job_id or "-",
        r.state,
        r.nodes or "-",
        "-" if r.step is None else str(r.step),
        "-" if r.checkpoint_step is None else str(r.checkpoint_step),
        attempts,
        note,
    )


def render_table(rows: Sequence[Any]) -> Any:
    """Rows -> a rich Table (pure: no I/O)."""
    from rich.table import Table

    table = Table(show_lines=False)
    for col in COLUMNS:
        table.add_column(col, overflow="fold", no_wrap=col in ("run", "job"))
    for r in rows:
        table.add_row(*cells(r))
    return table


def render_plain(rows: Sequence[Any]) -> str:
    """Rows -> aligned columns (pure), for long listings."""
    grid = [COLUMNS, *(cells(r) for r in rows)]
    widths = [max(len(row[i]) for row in grid) for i in range(len(COLUMNS) - 1)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in grid
    )


def attempt_lines(row: Any) -> list[str]:
    """One run's attempts, one line each (shown under the table for a single run)."""
    lines = []
    for a in row.history:
        took = ""
        if a.get("start") and a.get("end"):
            took = f" {a['end'] - a['start']:.0f}s"
        started = time.strftime("%H:%M:%S", time.localtime(a["start"])) if a.get("start") else "?"
        resumed = a.get("resumed_from")
        origin = f"step {resumed}" if resumed is not None else "scratch"
        text = (
            f"attempt {a.get('attempt')}: job {a.get('job_id')} on {a.get('nodes') or '?'} "
            f"at {started}{took}, from {origin} -> {a.get('cause')}"
        )
        if a.get("committed_step") is not None:
            text += f" (committed {a['committed_step']})"
        if a.get("blamed"):
            text += f", blamed {','.join(a['blamed'])}"
        if a.get("detail"):
            text += f": {a['detail']}"
        lines.append(text)
    return lines


@click.command("status")
@click.argument("runs", nargs=-1, metavar="[RUN|SWEEP]...", shell_complete=complete_targets)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--target",
    type=click.Choice(["slurm", "kubernetes"]),
    default="slurm",
    show_default=True,
    help="kubernetes: read the runs' state from their run directories alone (the pods' "
    "attempt records), asking no scheduler.",
)
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted.")
@click.option(
    "--interval",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between polls with --watch (never below $DDLAUNCH_MIN_POLL_S, default 30).",
)
def command(
    runs: tuple[str, ...], as_json: bool, target: str, watch: bool, interval: float
) -> None:
    """Show my runs (or the given RUNs or SWEEPs: id, id prefix or directory).

    The Slurm state of every job comes from ONE squeue call per poll; step, checkpoint,
    attempts and their causes, node health and the first failing rank come from the run
    directories. Without arguments a sweep is one summary row; name it to see its members.
    """
    from ddlaunch.app.status import collect, min_poll_interval
    from ddlaunch.cli.terminal import Terminal

    term = Terminal()
    if not watch:
        rows = collect(runs, target=target)
        if as_json:
            import sys

            # Indented for a person at a terminal; compact (C encoder, fast) for a script.
            indent = 2 if sys.stdout.isatty() else None
            term.out(json.dumps([r.as_dict() for r in rows], indent=indent))
            return
        if len(rows) == 1 and rows[0].failure:
            term.out(f"FAILED {rows[0].failure}")
        if len(rows) > RICH_MAX_ROWS:
            term.out(render_plain(rows))
        else:
            term.print(render_table(rows))
        if len(rows) == 1 and rows[0].history:
            term.out("\n".join(attempt_lines(rows[0])))
        return
    from rich.live import Live

    interval = max(interval, min_poll_interval())
    first = render_table(collect(runs, target=target))
    with Live(first, console=term.console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(render_table(collect(runs, target=target)), refresh=True)
