"""``ddlaunch report RUN``: one picture of a run (PNG) and an HTML page that embeds it.

The data comes from the run directory only (``ddlaunch.health.timeline`` builds it); the
drawing needs matplotlib, an optional extra: ``pip install 'ddlaunch[report]'``.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import click


def load_timeline(run_dir: Path) -> Any:
    from ddlaunch import fsutil
    from ddlaunch.checkpoint.layout import list_checkpoints
    from ddlaunch.health import timeline
    from ddlaunch.runs import read_run
    from ddlaunch.status import run_status

    info = read_run(run_dir)
    state = run_status(info, None).state
    checkpoints = []
    if info.checkpoint_root is not None and info.checkpoint_root.is_dir():
        for c in list_checkpoints(info.checkpoint_root):
            if c.complete and c.marker is not None:
                checkpoints.append((c.step, c.marker.time))
    failures = []
    for path in sorted((run_dir / "failures").glob("rank-*.json")):
        try:
            failures.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    samples = []
    steps = run_dir / "health" / "steps.jsonl"
    if steps.exists():
        for line in steps.read_text().splitlines():
            try:
                samples.append(json.loads(line))
            except ValueError:
                continue
    if not samples:
        # No watchdog history (an older run, or code without Session): the commit times of
        # the checkpoints still give a coarse step-over-time curve.
        samples = [{"time": when, "step": step} for step, when in sorted(checkpoints)]
    preflight = (fsutil.read_json(run_dir / "health" / "preflight.json") or {}).get("verdicts", [])
    return timeline.build(
        info.run_id,
        state,
        info.attempts,
        checkpoints,
        failures,
        samples,
        info.excluded,
        preflight,
        now=time.time(),
    )


def draw(t: Any, path: Path) -> None:
    """Two panels over one time axis (minutes since the first attempt): attempts as bars
    (colour = how they ended, label = nodes and blame) with checkpoint and failure marks;
    below, steps per second and the step reached."""
    try:
        import matplotlib
    except ImportError:
        from ddlaunch.errors import UserError

        raise UserError(
            "ddlaunch report draws with matplotlib: pip install 'ddlaunch[report]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ddlaunch.health.timeline import color, split_series, throughput

    o = t.origin

    def m(ts: float) -> float:
        return (ts - o) / 60.0

    fig, (ax, bx) = plt.subplots(
        2,
        1,
        figsize=(13, 3.2 + 0.55 * max(len(t.attempts), 1)),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(t.attempts), 1) + 1.5, 3]},
    )
    fig.suptitle(f"{t.run_id}: {t.state}", fontsize=13, fontweight="bold", y=0.995)
    for i, a in enumerate(t.attempts):
        end = a.end if a.end is not None else a.start
        ax.barh(
            i, max(m(end) - m(a.start), 0.02), left=m(a.start), color=color(a.cause), height=0.6
        )
        label = f"#{a.attempt} {a.nodes}: {a.cause}"
        if a.blamed:
            label += f" (blamed {','.join(a.blamed)})"
        if a.committed_step is not None:
            label += f", committed {a.committed_step}"
        ax.text(m(end) + 0.02, i, label, va="center", fontsize=9)
    ckpt_row = len(t.attempts)
    cks = [e for e in t.events if e.kind == "checkpoint"]
    fails = [e for e in t.events if e.kind == "failure"]
    if cks:
        ax.scatter(
            [m(e.time) for e in cks],
            [ckpt_row] * len(cks),
            marker="D",
            color="#1565c0",
            s=22,
            zorder=3,
        )
    span = max([m(e.time) for e in t.events] + [m(a.end or a.start) for a in t.attempts] + [0.1])
    last_x: float | None = None
    for e in cks:
        # Label a checkpoint with its step unless it would overprint the previous label.
        if last_x is None or m(e.time) - last_x > 0.04 * span:
            ax.annotate(
                str(e.step),
                (m(e.time), ckpt_row),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
                color="#1565c0",
            )
            last_x = m(e.time)
    if fails:
        ax.scatter(
            [m(e.time) for e in fails],
            [ckpt_row] * len(fails),
            marker="X",
            color="#b71c1c",
            s=60,
            zorder=4,
        )
    ax.set_yticks([*range(len(t.attempts)), ckpt_row])
    ax.set_yticklabels([*(f"attempt {a.attempt}" for a in t.attempts), "checkpoints / failures"])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    causes = sorted({a.cause for a in t.attempts})
    handles = [Patch(color=color(c), label=c) for c in causes]
    if t.excluded:
        handles.append(Patch(color="white", label=f"excluded: {', '.join(t.excluded)}"))
    # Above the panel, so that it never covers a bar or its label.
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    # One line per attempt: a line must not bridge the gap of a requeue.
    series = split_series(t)
    rates = [r for part in series for r in throughput(part)]
    for part in series:
        part_rates = throughput(part)
        if part_rates:
            bx.plot(
                [m(x) for x, _ in part_rates],
                [r for _, r in part_rates],
                color="#2e7d32",
                marker=".",
            )
    bx.set_ylabel("steps / s", color="#2e7d32")
    bx.grid(alpha=0.3)
    if t.samples:
        cx = bx.twinx()
        for part in series:
            cx.plot(
                [m(x) for x, _ in part],
                [s for _, s in part],
                color="#616161",
                linestyle="--",
                marker="|",
            )
        cx.set_ylabel("step reached (dashed)", color="#616161")
    if not rates:
        bx.text(
            0.5,
            0.5,
            "no step history (health/steps.jsonl)",
            transform=bx.transAxes,
            ha="center",
            color="#757575",
        )
    bx.set_xlabel("minutes since the first attempt started")
    xmax = max([m(a.end or a.start) for a in t.attempts] + [m(x) for x, _ in t.samples] + [0.1])
    ax.set_xlim(-0.02 * xmax, xmax * 1.45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command("report")
@click.argument("run", metavar="RUN")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Folder for report.png and report.html (default: <run dir>/report).",
)
def command(run: str, out: str | None) -> None:
    """Draw RUN: attempts on a timeline (nodes, how each ended, blamed nodes), checkpoints,
    failures and step throughput; write report.png and report.html (which embeds it)."""
    from ddlaunch import fsutil
    from ddlaunch.health.timeline import html_page
    from ddlaunch.runs import find_run

    run_dir = find_run(run)
    t = load_timeline(run_dir)
    folder = Path(out) if out else run_dir / "report"
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "report.png"
    draw(t, png)
    page = html_page(t, base64.b64encode(png.read_bytes()).decode("ascii"))
    fsutil.atomic_write_text(folder / "report.html", page)
    click.echo(f"{png}\n{folder / 'report.html'}")
