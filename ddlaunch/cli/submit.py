"""``ddlaunch submit``: create a run directory and submit (or run locally)."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from ddlaunch.cli.options import config_argument, force_option, set_option, target_option
from ddlaunch.cli.snapshot import echo_progress, report_snapshot


@click.command("submit")
@config_argument
@set_option
@target_option
@click.option(
    "--dry-run",
    is_flag=True,
    help="Make the checks a real submit makes (against the cluster, when Slurm answers), "
    "then print the script and the exact sbatch argv; create and submit nothing. What a "
    "real submit would refuse is a warning on stderr (with --force: that it would submit "
    "it anyway), and the exit status stays 0.",
)
@click.option(
    "--local",
    is_flag=True,
    help="Run the ranks as local processes instead of on Slurm (the default when "
    "no sbatch is on PATH).",
)
@click.option("--run-root", help="Create the run directory under this folder.")
@click.option(
    "--follow",
    "follow_",
    is_flag=True,
    help="Stream the batch log and rank 0's log until the run ends, across requeues; exit 0 "
    "if it completed, 1 otherwise. Ctrl-C detaches without cancelling.",
)
@click.option(
    "--ranks",
    default="0",
    show_default=True,
    metavar="all|N,M",
    help="With --follow: whose logs to stream (all: every rank, lines prefixed by rank).",
)
@click.option(
    "--after",
    "after",
    multiple=True,
    metavar="RUN[:ok|:any|:started]",
    help="Start only after RUN (an id, a unique id prefix or a run directory): :ok (the "
    "default) once it completed, :any once it ended, :started once it started. Repeatable. "
    "`ddlaunch resume RUN` moves this run onto RUN's new job; the ranks find RUN's run "
    "directory in $DDLAUNCH_AFTER_<NAME>_DIR (NAME: RUN's job.name, upper-cased).",
)
@force_option
def command(
    config: str,
    overrides: tuple[str, ...],
    target: str,
    dry_run: bool,
    local: bool,
    run_root: str | None,
    follow_: bool,
    ranks: str,
    after: tuple[str, ...],
    force: bool,
) -> None:
    """Submit CONFIG to Slurm and print the run id and job id (--target kubernetes: write
    the manifest into the run directory and kubectl apply it where kubectl can).

    CONFIG is a YAML file or a shipped preset name such as examples/mlp. The run directory
    (mode 0700) keeps the resolved config, the script, the git state and the job ids.
    Before sbatch, the job is checked against its partition (one sinfo call) and what it
    runs (script, entry point, interpreter): one that could never run is refused, with
    the numbers. `submit` returns as soon as sbatch has accepted the job.

    Chain an evaluation after a training run (it starts once the training completed, and
    follows it across `ddlaunch resume`):

    \b
        ddlaunch submit configs/eval.yaml --after mlp-20250101-120000-ab12cd34
    """
    workdir = os.getcwd()
    if target == "kubernetes":
        if local or follow_ or after:
            raise click.UsageError(
                "--local, --follow and --after are for Slurm runs (--target slurm)"
            )
        _submit_objects(config, overrides, dry_run, run_root, workdir)
        return
    _submit_slurm(
        config, overrides, dry_run, local, run_root, follow_, ranks, force, workdir, after
    )


def _submit_slurm(
    config: str,
    overrides: tuple[str, ...],
    dry_run: bool,
    local: bool,
    run_root: str | None,
    follow_: bool,
    ranks: str,
    force: bool,
    workdir: str,
    after: tuple[str, ...] = (),
) -> None:
    from ddlaunch.app import events
    from ddlaunch.app.submit_run import submit_run
    from ddlaunch.cli.local import NO_SBATCH

    chosen: tuple[int, ...] | None = (0,)
    steps = submit_run(
        config,
        overrides,
        dry_run=dry_run,
        local=local,
        run_root=run_root,
        force=force,
        workdir=workdir,
        after=after,
    )
    # Closed at once when a step here raises or exits (a local run's Ctrl-C, --follow's
    # end): whatever the use case holds is let go then, not when the traceback is freed.
    with contextlib.closing(steps):
        for event in steps:
            if echo_progress(event):
                continue
            match event:
                case events.DryRun(script=script, sbatch_line=sbatch_line):
                    click.echo(script, nl=False)
                    click.echo(f"# sbatch argv: {sbatch_line}")
                case events.RunsLocally(asked=asked):
                    if not asked:
                        click.echo(NO_SBATCH, err=True)
                case events.LocalRun(run_id=run_id, run_dir=run_dir, config=cfg):
                    from ddlaunch.cli.local import run_here

                    click.echo(f"run {run_id}")
                    run_here(run_dir, cfg)
                case events.Submitting():
                    from ddlaunch.cli.follow import parse_ranks

                    # Before sbatch: a bad --ranks submits nothing.
                    chosen = parse_ranks(ranks) if follow_ else (0,)
                case events.Accepted(run_id=run_id, run_dir=run_dir, job_id=job_id):
                    click.echo(f"run {run_id}  job {job_id}")
                    click.echo(f"run dir: {run_dir}")
                    if follow_:
                        from ddlaunch.app.follow import LogStream
                        from ddlaunch.cli.follow import follow_run

                        sys.stdout.flush()
                        follow_run(run_dir, LogStream(run_dir, chosen, prefix=chosen != (0,)))


def _submit_objects(
    config: str, overrides: tuple[str, ...], dry_run: bool, run_root: str | None, workdir: str
) -> None:
    from ddlaunch.app.kubernetes import prepare_objects, submit_objects

    prepared = prepare_objects(
        config,
        overrides,
        run_root=run_root,
        workdir=workdir,
        snapshot="path" if dry_run else "store",
    )
    report_snapshot(prepared.config, prepared.snapshot, stored=not dry_run)
    plan = prepared.plan
    if dry_run:
        click.echo(prepared.manifest, nl=False)
        click.echo(f"# kubectl argv: kubectl apply -f {plan.manifest_path}")
        return
    done = submit_objects(prepared, workdir=workdir)
    kind = "JobSet" if plan.kind == "jobset" else "PyTorchJob"
    if done.applied:
        click.echo(f"run {done.run_id}  {kind} {done.name}")
    else:
        click.echo(f"{done.why_not}: not applied", err=True)
        click.echo(f"run {done.run_id}  {kind} {done.name} (not applied)")
        click.echo(f"apply it with: kubectl apply -f {plan.manifest_path}")
    click.echo(f"run dir: {done.run_dir}")
