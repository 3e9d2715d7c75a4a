"""The picture of ``ddlaunch report`` (matplotlib, imported only here): two panels over one
time axis (minutes since the first attempt). Above: attempts as bars (colour = how they
ended, label = nodes and blame) with checkpoint and failure marks; below, steps per second
and the step reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddlaunch.app.report import Event, Timeline, color, split_series, throughput
from ddlaunch.errors import UserError


def draw(t: Timeline, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "ddlaunch report draws with matplotlib: pip install 'ddlaunch[report]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(t.attempts), 1)
    fig, (ax, bx) = plt.subplots(
        2,
        1,
        figsize=(13, 3.2 + 0.55 * rows),
        sharex=True,
        gridspec_kw={"height_ratios": [rows + 1.5, 3]},
    )
    fig.suptitle(f"{t.run_id}: {t.state}", fontsize=13, fontweight="bold", y=0.995)
    minutes = _Minutes(t.origin)
    _attempt_bars(ax, t, minutes)
    _marks(ax, t, minutes)
    _legend(ax, t)
    _throughput(bx, t, minutes)
    xmax = max(
        [minutes(a.end or a.start) for a in t.attempts] + [minutes(x) for x, _ in t.samples] + [0.1]
    )
    ax.set_xlim(-0.02 * xmax, xmax * 1.45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class _Minutes:
    def __init__(self, origin: float) -> None:
        self.origin = origin

    def __call__(self, ts: float) -> float:
        return (ts - self.origin) / 60.0


def _attempt_bars(ax: Any, t: Timeline, m: _Minutes) -> None:
    for i, a in enumerate(t.attempts):
        end = a.end if a.end is not None else a.start
        ax.barh(
            i, max(m(end) - m(a.start), 0.02), left=m(a.start), color=color(a.cause), height=0.6
        )
        if a.staging is not None:  # the data staging phase, over the attempt's start
            first, last = a.staging
            ax.barh(
                i,
                max(m(last) - m(first), 0.01),
                left=m(first),
                height=0.6,
                color="none",
                edgecolor="black",
                hatch="///",
                linewidth=0.6,
            )
        label = f"#{a.attempt} {a.nodes}: {a.cause}"
        if a.blamed:
            label += f" (blamed {','.join(a.blamed)})"
        if a.committed_step is not None:
            label += f", committed {a.committed_step}"
        if a.staging_s is not None:
            label += f", staging {a.staging_s:.1f} s"
        ax.text(m(end) + 0.02, i, label, va="center", fontsize=9)
    ckpt_row = len(t.attempts)
    ax.set_yticks([*range(len(t.attempts)), ckpt_row])
    ax.set_yticklabels([*(f"attempt {a.attempt}" for a in t.attempts), "checkpoints / failures"])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _marks(ax: Any, t: Timeline, m: _Minutes) -> None:
    """Checkpoints (labelled with their step) and failures on the row below the attempts."""
    row = len(t.attempts)
    cks = [e for e in t.events if e.kind == "checkpoint"]
    fails = [e for e in t.events if e.kind == "failure"]
    if cks:
        xs = [m(e.time) for e in cks]
        ax.scatter(xs, [row] * len(cks), marker="D", color="#1565c0", s=22, zorder=3)
    span = max([m(e.time) for e in t.events] + [m(a.end or a.start) for a in t.attempts] + [0.1])
    for e in _spaced(cks, m, 0.04 * span):
        ax.annotate(
            str(e.step),
            (m(e.time), row),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
            color="#1565c0",
        )
    if fails:
        xs = [m(e.time) for e in fails]
        ax.scatter(xs, [row] * len(fails), marker="X", color="#b71c1c", s=60, zorder=4)


def _spaced(events: list[Event], m: _Minutes, gap: float) -> list[Event]:
    """The events whose label would not overprint the previous label."""
    out: list[Event] = []
    for e in events:
        if not out or m(e.time) - m(out[-1].time) > gap:
            out.append(e)
    return out


def _legend(ax: Any, t: Timeline) -> None:
    from matplotlib.patches import Patch

    causes = sorted({a.cause for a in t.attempts})
    handles = [Patch(color=color(c), label=c) for c in causes]
    if any(a.staging is not None for a in t.attempts):
        handles.append(
            Patch(facecolor="white", edgecolor="black", hatch="///", label="data staging")
        )
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


def _throughput(bx: Any, t: Timeline, m: _Minutes) -> None:
    # One line per attempt: a line must not bridge the gap of a requeue.
    series = split_series(t)
    rates = [r for part in series for r in throughput(part)]
    for part in series:
        part_rates = throughput(part)
        if part_rates:
            xs = [m(x) for x, _ in part_rates]
            bx.plot(xs, [r for _, r in part_rates], color="#2e7d32", marker=".")
    bx.set_ylabel("steps / s", color="#2e7d32")
    bx.grid(alpha=0.3)
    if t.samples:
        cx = bx.twinx()
        for part in series:
            xs = [m(x) for x, _ in part]
            cx.plot(xs, [s for _, s in part], color="#616161", linestyle="--", marker="|")
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
