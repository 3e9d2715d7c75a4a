"""``ddlaunch doctor``: submit a preflight-only job and print a verdict per node."""

from __future__ import annotations

import json
from typing import Any

import click

from ddlaunch.cli.options import force_option, set_option


def table(rows: list[Any]) -> Any:
    from rich.table import Table

    t = Table(show_lines=True)
    for col in ("node", "verdict", "gpus", "disk", "torch", "bandwidth", "fabric"):
        t.add_column(col, overflow="fold")
    for r in rows:
        disk = "\n".join(
            f"{k[5:]}: {v.rsplit(': ', 1)[-1]}"
            for k, v in r.checks.items()
            if k.startswith("disk:")
        )
        t.add_row(
            r.node,
            r.verdict,
            r.checks.get("gpus", r.checks.get("report", "-")),
            disk or "-",
            r.checks.get("torch", "-"),
            r.checks.get("bandwidth", "-"),
            "\n".join(r.fabric) or "-",
        )
    return t


@click.command("doctor")
@click.argument("config", required=False)
@set_option
@click.option("--nodes", "count", type=int, help="Check this many nodes (default: the config's).")
@click.option("--nodelist", help="Check exactly these nodes (Slurm hostlist, e.g. node[1-3]).")
@click.option("--timeout", type=float, default=900, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@force_option
def command(
    config: str | None,
    overrides: tuple[str, ...],
    count: int | None,
    nodelist: str | None,
    timeout: float,
    as_json: bool,
    force: bool,
) -> None:
    """Run the preflight checks (GPUs, free space, torch, all-reduce bandwidth, and the fabric
    profile where ibv_devinfo/ibstat/nvidia-smi/ip exist) as a short job, one task per node,
    and print a verdict per node. CONFIG defaults to the config of my latest run. While it
    waits, each change of the job's state is shown with its pending reason; Ctrl-C cancels
    the job."""
    from ddlaunch.app.doctor import run_doctor

    done = run_doctor(
        config,
        overrides,
        count=count,
        nodelist=nodelist,
        timeout=timeout,
        started=lambda job_id, run_dir: click.echo(f"doctor job {job_id} ({run_dir})", err=True),
        force=force,
        tell=lambda line: click.echo(line, err=True),
        probe=True,
    )
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in done.rows], indent=2))
        return
    from ddlaunch.cli.terminal import Terminal

    term = Terminal()
    term.print(table(done.rows))
    if done.unchecked:
        term.out("could not be checked:\n  " + "\n  ".join(done.unchecked))
