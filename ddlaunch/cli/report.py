"""``ddlaunch report``: one picture of a run and a page that embeds it."""

from __future__ import annotations

import base64
from pathlib import Path

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
    from ddlaunch import fsutil
    from ddlaunch.app.report import html_page, load_timeline
    from ddlaunch.app.report_figure import draw
    from ddlaunch.app.runs import find_run
    from ddlaunch.slurm.client import SlurmClient

    run_dir = find_run(run)
    t = load_timeline(run_dir, SlurmClient())
    folder = Path(out) if out else run_dir / "report"
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "report.png"
    draw(t, png)
    page = html_page(t, base64.b64encode(png.read_bytes()).decode("ascii"))
    fsutil.atomic_write_text(folder / "report.html", page)
    click.echo(f"{png}\n{folder / 'report.html'}")
    for problem in t.problems:  # drawn without them; the page says so too
        click.echo(problem, err=True)
