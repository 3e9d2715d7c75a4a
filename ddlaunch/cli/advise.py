"""``ddlaunch advise``: the checkpoint interval a run should use, from its measured costs."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_runs


@click.command("advise")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option(
    "--mttf-hours",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Mean time between failures of the job (default: fault_tolerance.mttf_hours, "
    "else the run's own failures).",
)
def command(run: str, mttf_hours: float | None) -> None:
    """Advise RUN's checkpoint interval: its measured save stall C and restart cost R, an
    MTTF, the interval of highest predicted ETTR (useful training time / wall time) and
    that ETTR, beside the ETTR now."""
    from ddlaunch.app import advise
    from ddlaunch.app.run_refs import find_run
    from ddlaunch.app.runs import run_id

    run_dir = find_run(run)
    # Given here, the MTTF needs no failure of the run.
    advice = advise.advise_run(run_dir, mttf_override=mttf_hours)
    click.echo("\n".join(advise.lines(run_id(run_dir), advice)))
