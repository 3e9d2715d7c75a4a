"""``submit --local``: the same run directory as a Slurm submission, ranks run here."""

from __future__ import annotations

import time

import click

from ddlaunch.config.validate import parse_duration
from ddlaunch.prepare import Prepared
from ddlaunch.runner import SubprocessRunner


def submit_local(prepared: Prepared, *, workdir: str) -> list[dict]:
    from ddlaunch.launch.local import LocalRunError, run_local
    from ddlaunch.submit import create_run_dir

    run_dir = create_run_dir(prepared, SubprocessRunner(), workdir)
    cfg = prepared.config
    timeout_s = float(parse_duration(cfg.job.time) or 24 * 3600)
    click.echo(f"run {prepared.plan.run_id}  local, {cfg.world_size} ranks")
    click.echo(f"run dir: {run_dir.path}")
    started = time.time()
    try:
        results = run_local(run_dir.path, cfg.world_size, timeout_s)
    except LocalRunError as exc:
        run_dir.write_json(
            "outcome.json", {"state": "FAILED", "reason": str(exc), "time": time.time()}
        )
        raise
    run_dir.write_json(
        "outcome.json",
        {"state": "COMPLETED", "time": time.time(), "seconds": round(time.time() - started, 2)},
    )
    summary = run_dir.read_json("result.json")
    if summary:
        click.echo(
            "result: "
            + ", ".join(f"{k}={v}" for k, v in summary.items() if not isinstance(v, dict | list))
        )
    click.echo(f"completed in {time.time() - started:.1f} s")
    return results
