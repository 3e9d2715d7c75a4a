"""``ddlaunch status``: my runs, or one run, from the run directory plus one squeue call."""

from __future__ import annotations

import json
import time

import click


def collect(refs: tuple[str, ...]) -> list:
    from ddlaunch.runs import find_run, list_runs, read_run
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.status import run_status

    paths = [find_run(r) for r in refs] if refs else list_runs()
    infos = [read_run(p) for p in paths]
    client = SlurmClient()
    job_ids = [i.job_id for i in infos if i.job_id]
    # One batched squeue call for every job ddlaunch knows, whatever their number.
    queue = client.queue(job_ids) if job_ids else {}
    rows = []
    for info in infos:
        row = queue.get(info.job_id) if info.job_id else None
        shown = client.show_job(info.job_id) if info.job_id and row is None else None
        rows.append(run_status(info, row, shown))
    return rows


def render_table(rows: list) -> object:
    from rich.table import Table

    table = Table(show_lines=False)
    for col in ("run", "job", "state", "nodes", "step", "ckpt", "attempts", "note"):
        table.add_column(col, overflow="fold", no_wrap=col in ("run", "job", "state"))
    for r in rows:
        note = r.failure or r.detail or r.reason or ""
        table.add_row(
            r.run_id,
            r.job_id or "-",
            r.state,
            r.nodes or "-",
            "-" if r.step is None else str(r.step),
            "-" if r.checkpoint_step is None else str(r.checkpoint_step),
            str(r.attempts),
            note,
        )
    return table


@click.command("status")
@click.argument("runs", nargs=-1, metavar="[RUN]...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted.")
@click.option(
    "--interval",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between polls with --watch (at least 30 s unless "
    "DDLAUNCH_MIN_POLL_S allows less).",
)
def command(runs: tuple[str, ...], as_json: bool, watch: bool, interval: float) -> None:
    """Show the state of my runs (or the given RUNs: id, id prefix or run directory).

    The state comes from one squeue call for all runs; step, checkpoints, attempts and
    failures come from the run directories. A failed run shows its failing rank, host
    and exception first.
    """
    import os

    from ddlaunch.ui import Terminal

    term = Terminal()
    if not watch:
        rows = collect(runs)
        if as_json:
            term.out(json.dumps([r.as_dict() for r in rows], indent=2))
            return
        if len(rows) == 1 and rows[0].failure:
            term.out(f"FAILED {rows[0].failure}")
        term.print(render_table(rows))
        return
    from rich.live import Live

    floor = float(os.environ.get("DDLAUNCH_MIN_POLL_S", "30"))
    interval = max(interval, floor)
    with Live(render_table(collect(runs)), console=term.console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(render_table(collect(runs)), refresh=True)
