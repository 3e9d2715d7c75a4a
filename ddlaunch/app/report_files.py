"""``report`` as one use case: find the run, build its timeline (one queue query while the
run has not concluded), draw report.png and write report.html, which embeds it."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from ddlaunch import fsutil
from ddlaunch.app.report import html_page, load_timeline
from ddlaunch.app.report_figure import draw  # matplotlib itself only when drawing
from ddlaunch.app.run_refs import find_run
from ddlaunch.errors import UserError
from ddlaunch.slurm.client import SlurmClient


@dataclass(frozen=True)
class ReportFiles:
    """The files written, and the records the picture was drawn without (the page says so)."""

    png: Path
    html: Path
    problems: tuple[str, ...]


def write_report(run: str, out: str | None = None) -> ReportFiles:
    """Draw ``run`` (an id, an id prefix, SWEEP/<i> or a run directory) into ``out``
    (default: <run dir>/report)."""
    run_dir = find_run(run)
    t = load_timeline(run_dir, SlurmClient())
    folder = Path(out) if out else run_dir / "report"
    png, html = folder / "report.png", folder / "report.html"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        draw(t, png)
        page = html_page(t, base64.b64encode(png.read_bytes()).decode("ascii"))
        fsutil.atomic_write_text(html, page)
    except OSError as exc:  # a folder that cannot be made or written: the user's to fix
        where = "--out" if out else "the run directory"
        raise UserError(
            f"cannot write the report into {folder} ({where}): {exc.strerror or exc}"
        ) from None
    return ReportFiles(png, html, tuple(t.problems))
