"""The picture of ``ddlaunch report`` (matplotlib, imported only here): two panels over one
time axis (minutes since the first attempt). Above: attempts as bars (colour = how they
ended, label = nodes, blame and in-process restarts), with replica groups a lane per group
whose bars are its restarts (from its failure to its return to the quorum; colour = cause),
with components a lane per component (a train component's ranks, nodes and pace over its
attempts; a service's starts, coloured by how each ended, failures marked), and checkpoint
and failure marks; below, steps per second and the step reached."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ddlaunch.app import report_components as parts
from ddlaunch.app.report import Event, Timeline, color, split_series, throughput
from ddlaunch.app.report_groups import bars, lanes
from ddlaunch.errors import UserError
from ddlaunch.wording import counted


def draw(t: Timeline, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            "ddlaunch report draws with matplotlib: pip install 'ddlaunch[report]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(_first_mark_row(t), 1)
    why = ended_lines(t)
    under = REASON_LINE_IN * len(why)  # the panels keep their height under a longer title
    fig, (ax, bx) = plt.subplots(
        2,
        1,
        figsize=(13, 3.2 + 0.55 * rows + under),
        sharex=True,
        gridspec_kw={"height_ratios": [rows + 1.5, 3]},
    )
    fig.suptitle(f"{t.run_id}: {t.state}", fontsize=13, fontweight="bold", y=0.995)
    height = fig.get_figheight()
    if why:  # under the state, smaller: a rank's error may be hundreds of characters
        top = 1 - HEAD_IN / height
        fig.text(0.5, top, "\n".join(why), ha="center", va="top", fontsize=9)
    minutes = _Minutes(t.origin)
    _attempt_bars(ax, t, minutes)
    _group_lanes(ax, t, minutes)
    _component_lanes(ax, t, minutes)
    _rows(ax, t)
    _marks(ax, t, minutes)
    _legend(ax, t)
    _throughput(bx, t, minutes)
    ax.set_xlim(*x_limits(t))
    if t.note:
        ax.text(0.5, 0.5, t.note, transform=ax.transAxes, ha="center", color="#757575")
    # The panels below the reason's lines (tight_layout makes room for the suptitle only).
    fig.tight_layout(rect=(0, 0, 1, 1 - under / height) if why else None)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Why the run ended, under the title: characters a line holds at the figure's width in
# its font (9 pt), the inches each line takes, and the inches of the title's own line.
REASON_WIDTH = 170
REASON_LINE_IN = 0.17
HEAD_IN = 0.32


def ended_lines(t: Timeline) -> list[str]:
    """Why the run ended (``Timeline.ended``), wrapped to the figure's width; none while it
    runs."""
    return textwrap.wrap(t.ended, REASON_WIDTH)


def x_limits(t: Timeline) -> tuple[float, float]:
    """The time axis spans the data (attempts, marks, samples), with a small margin: the
    labels are drawn inside it, above the bars."""
    m = _Minutes(t.origin)
    ends = [m(a.end or a.start) for a in t.attempts] + [m(e.time) for e in t.events]
    ends += [m(g.back or g.time) for g in t.group_restarts]
    ends += [m(x) for x in parts.times(t.components)]
    xmax = max([*ends, *(m(x) for x, _ in t.samples), 0.1])
    return -0.02 * xmax, 1.03 * xmax


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
        label = f"#{a.attempt} {a.nodes}{' (restart in the allocation)' if a.in_allocation else ''}"
        if a.shrunk:
            label += " (shrunk)"
        label += f": {a.cause}"
        if a.blamed:
            label += f" (blamed {','.join(a.blamed)})"
        if a.committed_step is not None:
            label += f", committed {a.committed_step}"
        if a.in_process:
            label += f", {counted(a.in_process, 'in-process restart')}"
        if a.staging_s is not None:
            label += f", staging {a.staging_s:.1f} s"
        # Above the bar, from its start (from its end, leftwards, in the right half of the
        # axis): it stays inside the axis, whatever the bar's length.
        right = m(a.start) > 0.55 * x_limits(t)[1]
        x, ha = (m(end), "right") if right else (m(a.start), "left")
        ax.text(x, i - 0.34, label, va="bottom", ha=ha, fontsize=8)


def _group_lanes(ax: Any, t: Timeline, m: _Minutes) -> None:
    """A lane per replica group under the attempts: each restart a bar from the failure to
    the group's return (hatched where it never came back), labelled with its cause."""
    drawn = lanes(t.group_restarts, t.groups)
    row = {g: len(t.attempts) + i for i, g in enumerate(drawn)}
    ends = {a.attempt: a.end for a in t.attempts}
    high = x_limits(t)[1]
    for bar in bars(t.group_restarts, ends):
        y = row[bar.lane]
        ax.barh(
            y,
            max(m(bar.end) - m(bar.start), 0.02),
            left=m(bar.start),
            height=0.45,
            color=color(bar.cause),
            hatch="xx" if bar.open else None,
        )
        right = m(bar.start) > 0.55 * high
        x, ha = (m(bar.end), "right") if right else (m(bar.start), "left")
        ax.text(x, y - 0.26, bar.label, va="bottom", ha=ha, fontsize=7)


def _component_lanes(ax: Any, t: Timeline, m: _Minutes) -> None:
    """A lane per component under the groups' lanes: a train component spans each attempt,
    labelled with its ranks, nodes and pace; a service has a bar per start (from its start
    to its end; colour = how it ended), a cross where one failed."""
    c = t.components
    if c is None:
        return
    first = len(t.attempts) + len(lanes(t.group_restarts, t.groups))
    high = x_limits(t)[1]
    for i, lane in enumerate(c.train):
        y = first + i
        for a in t.attempts:
            end = a.end if a.end is not None else a.start
            ax.barh(y, max(m(end) - m(a.start), 0.02), left=m(a.start), height=0.3, color="#c5cae9")
        x = m(t.attempts[0].start) if t.attempts else 0.0
        ax.text(x, y - 0.2, lane.label(), va="bottom", ha="left", fontsize=7)
    now = max([a.end for a in t.attempts if a.end is not None] or [0.0]) or None
    for j, service in enumerate(c.services):
        y = first + len(c.train) + j
        for bar in parts.service_bars(service, now):
            ax.barh(
                y,
                max(m(bar.end) - m(bar.start), 0.02),
                left=m(bar.start),
                height=0.45,
                color=parts.BAR_COLORS[bar.how],
            )
            if bar.how != parts.ENDED:
                right = m(bar.start) > 0.55 * high
                x, ha = (m(bar.end), "right") if right else (m(bar.start), "left")
                ax.text(x, y - 0.26, bar.label, va="bottom", ha=ha, fontsize=7)
        failed = [r.end for r in parts.failures(service) if r.end is not None]
        if failed:
            ax.scatter(
                [m(x) for x in failed],
                [y] * len(failed),
                marker="X",
                color="#b71c1c",
                s=40,
                zorder=4,
            )


def _first_mark_row(t: Timeline) -> int:
    """The marks' row: under the attempts, the groups' lanes and the components' lanes."""
    drawn = len(lanes(t.group_restarts, t.groups))
    return len(t.attempts) + drawn + (len(t.components.lanes) if t.components else 0)


def _rows(ax: Any, t: Timeline) -> None:
    """The row labels: attempts, the groups' lanes, the components' lanes, then the marks'
    row."""
    drawn = lanes(t.group_restarts, t.groups)
    ckpt_row = _first_mark_row(t)
    labels = [f"attempt {a.attempt}" for a in t.attempts] + [f"group {g}" for g in drawn]
    labels += t.components.lanes if t.components else []
    ax.set_yticks([*range(ckpt_row), ckpt_row])
    ax.set_yticklabels([*labels, "checkpoints / failures"])
    ax.set_ylim(ckpt_row + 0.6, -0.9)  # inverted: attempt 0 on top, room for its label
    ax.grid(axis="x", alpha=0.3)


def _marks(ax: Any, t: Timeline, m: _Minutes) -> None:
    """Checkpoints (labelled with their step) and failures on the row below the attempts
    (and the groups' lanes)."""
    row = _first_mark_row(t)
    cks = [e for e in t.events if e.kind == "checkpoint"]
    pruned = [e for e in t.events if e.kind == "save"]
    fails = [e for e in t.events if e.kind == "failure"]
    if pruned:  # saved, no longer on disk (keep_last): hollow, so the kept ones stand out
        xs = [m(e.time) for e in pruned]
        ax.scatter(
            xs,
            [row] * len(pruned),
            marker="D",
            facecolors="none",
            s=22,
            zorder=3,
            edgecolors="#1565c0",
        )
    if cks:
        xs = [m(e.time) for e in cks]
        ax.scatter(xs, [row] * len(cks), marker="D", color="#1565c0", s=22, zorder=3)
    low, high = x_limits(t)
    saved = sorted(cks + pruned, key=lambda e: e.time)
    for e in _spaced(saved, m, LABEL_GAP * (high - low)):
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


# A checkpoint's step label is drawn only this far (a fraction of the axis, ~6 characters
# of the label font at the figure's width) from the previous one: labels never overprint.
LABEL_GAP = 0.045


def _spaced(events: list[Event], m: _Minutes, gap: float) -> list[Event]:
    """The events whose label would not overprint another's, chosen from the newest back:
    the latest checkpoint, the one a resume starts from, is always labelled."""
    out: list[Event] = []
    for e in reversed(events):
        if not out or m(out[-1].time) - m(e.time) > gap:
            out.append(e)
    return out[::-1]


def _legend(ax: Any, t: Timeline) -> None:
    from matplotlib.patches import Patch

    causes = sorted({a.cause for a in t.attempts})
    handles: list[Any] = [Patch(color=color(c), label=c) for c in causes]
    if any(a.staging is not None for a in t.attempts):
        handles.append(
            Patch(facecolor="white", edgecolor="black", hatch="///", label="data staging")
        )
    if any(e.kind == "save" for e in t.events):
        from matplotlib.lines import Line2D

        handles.append(
            Line2D(
                [],
                [],
                marker="D",
                linestyle="none",
                markerfacecolor="none",
                markeredgecolor="#1565c0",
                label="saved, no longer on disk (keep_last)",
            )
        )
    if t.excluded:
        handles.append(Patch(color="white", label=f"excluded: {', '.join(t.excluded)}"))
    if not handles:  # no attempt (a local run of an old version, a failed submission)
        return
    # Above the panel, so that it never covers a bar or its label.
    ax.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )


def throughput_note(t: Timeline) -> str | None:
    """What the throughput panel says when it has no rate to draw (and only then)."""
    if any(throughput(part) for part in split_series(t)):
        return None
    if t.samples:
        return "too few step samples per attempt for a rate (health/steps.jsonl, timings.jsonl)"
    return "no step history (health/steps.jsonl, timings.jsonl)"


def _throughput(bx: Any, t: Timeline, m: _Minutes) -> None:
    # One line per attempt: a line must not bridge the gap of a requeue.
    series = split_series(t)
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
    text = throughput_note(t)
    if text:
        bx.text(0.5, 0.5, text, transform=bx.transAxes, ha="center", color="#757575")
    bx.set_xlabel("minutes since the first attempt started")
