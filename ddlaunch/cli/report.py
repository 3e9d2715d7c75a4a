"""``ddlaunch report``: one picture of a run and a page that embeds it."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_runs


@click.command("report")
@click.argument("run", metavar="RUN", shell_complete=complete_runs)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Folder for report.png and report.html (default: <run dir>/report).",
)
def command(run: str, out: str | None) -> None:
    """Draw RUN (a run id, an id prefix, SWEEP/<i> or a run directory): attempts on a
    timeline (nodes, how each ended, blamed nodes), checkpoints, failures and step
    throughput; write report.png and report.html (which embeds it)."""
    from ddlaunch.app.report_files import write_report

    done = write_report(run, out)
    click.echo(f"{done.png}\n{done.html}")
    for problem in done.problems:  # drawn without them; the page says so too
        click.echo(problem, err=True)
