"""``ddlaunch doctor``: submit a preflight-only job and print a verdict per node."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import click

from ddlaunch.cli.options import set_option


def _config_source(config: str | None) -> str:
    """The config to check against: the one given, else that of my latest run."""
    from ddlaunch.errors import UserError
    from ddlaunch.runs import list_runs

    if config:
        return config
    runs = list_runs()
    if not runs:
        raise UserError("give a CONFIG (no earlier run to take the cluster settings from)")
    return str(runs[-1] / "config.yaml")


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
def command(
    config: str | None,
    overrides: tuple[str, ...],
    count: int | None,
    nodelist: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Run the preflight checks (GPUs, free space, torch, all-reduce bandwidth, and the fabric
    profile where ibv_devinfo/ibstat/nvidia-smi/ip exist) as a short job, one task per node,
    and print a verdict per node. CONFIG defaults to the config of my latest run."""
    from ddlaunch import fsutil
    from ddlaunch.errors import UserError
    from ddlaunch.health import doctor, preflight
    from ddlaunch.health.hooks import evaluate, read_reports
    from ddlaunch.prepare import prepare
    from ddlaunch.rundir import new_run_id
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.status import ACTIVE_STATES, fold_state
    from ddlaunch.worker.distenv import expand_hostlist

    names = expand_hostlist(nodelist) if nodelist else []
    prepared = prepare(_config_source(config), overrides)
    cfg, plan = prepared.config, prepared.plan
    run_id = new_run_id("doctor")
    # Under <run root>/doctor/: not a run, so `status` does not list it.
    run_dir = Path(plan.run_dir).parent / "doctor" / run_id
    (run_dir / "logs").mkdir(parents=True, mode=0o700)
    # The node task reads its thresholds from the run directory, as in a training job.
    import yaml

    from ddlaunch.config.validate import to_plain

    fsutil.atomic_write_text(
        run_dir / "config.yaml", yaml.safe_dump(to_plain(cfg), sort_keys=False), 0o600
    )
    minutes = max(2, math.ceil(cfg.health.preflight_timeout / 60) + 1)
    directives = doctor.doctor_directives(
        plan.directives, nodes=count, nodelist=names, minutes=minutes
    )
    script = doctor.doctor_script(
        directives, str(run_dir), [*plan.fabric_env, *plan.user_env], plan.setup, plan.python
    )
    fsutil.atomic_write_text(run_dir / "doctor.sbatch", script, 0o700)
    client = SlurmClient()
    job_id = client.sbatch(
        [
            "sbatch",
            "--parsable",
            f"--output={run_dir / 'logs' / 'batch-%j.out'}",
            f"--chdir={run_dir}",
            str(run_dir / "doctor.sbatch"),
        ]
    )
    click.echo(f"doctor job {job_id} ({run_dir})", err=True)
    deadline = time.monotonic() + timeout
    nodes_seen = ""
    while True:
        row = client.status_rows([job_id]).get(job_id)
        if row is not None and row.nodes:
            nodes_seen = row.nodes
        if row is None or fold_state(row.state) not in ACTIVE_STATES:
            break
        if time.monotonic() > deadline:
            client.cancel([job_id])
            raise UserError(f"doctor job {job_id} did not finish in {timeout:.0f} s; cancelled")
        time.sleep(2)
    reports = read_reports(preflight.reports_dir(run_dir, job_id, 0))
    nodes = expand_hostlist(nodes_seen) if nodes_seen else sorted(reports)
    if not nodes:
        raise UserError(f"doctor job {job_id} left no report; see {run_dir / 'logs'}")
    rows = doctor.verdict_rows(evaluate(cfg, nodes, reports), reports)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    from ddlaunch.ui import Terminal

    term = Terminal()
    term.print(table(rows))
    unchecked = sorted({u for r in rows for u in r.unchecked})
    if unchecked:
        term.out("could not be checked:\n  " + "\n  ".join(unchecked))
