"""``ddlaunch status``: my runs, one run or a sweep, from the run directories plus one squeue
call per poll for the runs that have not ended (``ddlaunch.app.status_poll.view``)."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from typing import Any

import click

from ddlaunch.cli.completion import complete_targets
from ddlaunch.cli.table import ELLIPSIS, TAIL, Column, fit, unique_prefixes, wrap
from ddlaunch.cli.terminal import table_width
from ddlaunch.wording import plural

COLUMNS = (
    Column("run", "shrink"),
    Column("job"),
    Column("state"),
    Column("nodes", "detail", rank=1),
    Column("step", right=True),
    Column("ckpt", "detail", right=True, rank=3),
    Column("attempts", "detail", right=True, rank=2),
    Column("note", "note"),
)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def note(r: Any) -> str:
    """What a user acts on, in one cell: a member's overrides, the failure and why the run
    stopped (or why it waits), the running attempt's failure while its verdict is pending,
    node health (`status RUN` lists every attempt's cause)."""
    said = ended_words(r) or r.reason or ""
    parts = [r.label or "", said, r.failing or "", r.health, *r.problems]
    return "; ".join(p for p in parts if p)


def ended_words(r: Any) -> str:
    """The run's failure and how it ended, in the words ``report`` heads it with
    (``app.status_blame.ended_words``)."""
    from ddlaunch.app.status_blame import ended_words as words

    return words(r.failure, r.detail)


CULPRIT_WIDTH = 60  # of each earlier failure in the attempts cell (`status RUN`: all of it)


def shorten_end(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS


def earlier_failures(r: Any, whole: bool = False) -> str:
    """How each earlier attempt failed: ``0: rank 1 on node1 killed by SIGKILL``, each cut
    to ``CULPRIT_WIDTH`` unless ``whole`` (a pipe's row: nothing shortened). The latest
    attempt's failure, when it is the run's headline, is not history (it is while the job
    waits for its next attempt)."""
    history = r.history[:-1] if r.failure else r.history
    return "; ".join(
        f"{a.get('attempt')}: {a['culprit'] if whole else shorten_end(a['culprit'], CULPRIT_WIDTH)}"
        for a in history
        if a.get("culprit")
    )


def attempts_cell(r: Any, whole: bool = False) -> str:
    """The count, and how each earlier attempt failed: ``2 (0: rank 1 on node1 killed by
    SIGKILL)`` (one cell: a pipe's row)."""
    earlier = earlier_failures(r, whole)
    count = _num(r.attempts)
    return f"{count} ({earlier})" if earlier else count


def cells(r: Any, whole: bool = False, counts_only: bool = False) -> tuple[str, ...]:
    """A row's cells; ``counts_only``: the attempts cell is the count (each attempt has a
    line of its own under the table)."""
    return (
        r.run_id,
        r.job_id or "-",
        r.state,
        r.nodes or "-",
        _num(r.step),
        _num(r.checkpoint_step),
        _num(r.attempts) if counts_only else attempts_cell(r, whole),
        note(r),
    )


# At a terminal the earlier attempts' failures are a column of their own that moves under
# the row first (before the nodes and the counts), so that the count stays in its column.
EARLIER = Column("earlier", "detail", rank=0)


def render(
    rows: Sequence[Any], width: int | None, names: Sequence[str] = (), lines_follow: bool = False
) -> str:
    """Rows -> the table (pure). ``width``: the terminal's, or None for a pipe (one row per
    line, the attempts cell whole). ``names``: every id the run root holds, so that a run id
    shortened to fit keeps a prefix unique among them (``prefix…suffix`` is accepted back
    wherever a run id is). ``lines_follow``: each attempt gets a line under the table, so
    the attempts cell is the count alone (not each failure twice)."""
    ids = [r.run_id for r in rows]
    prefixes = unique_prefixes(ids, names)
    shortest = max((min(prefixes[i] + 1 + TAIL, len(i)) for i in ids), default=0)
    columns = [Column("run", "shrink", min_width=shortest), *COLUMNS[1:]]
    table = [list(cells(r, width is None, lines_follow)) for r in rows]
    if lines_follow:
        return "\n".join(fit(columns, table, width))
    if width is not None and any(earlier_failures(r) for r in rows):
        columns.insert(7, EARLIER)
        for cell, r in zip(table, rows, strict=True):
            cell[6] = _num(r.attempts)
            cell.insert(7, earlier_failures(r))
    return "\n".join(fit(columns, table, width))


# How much deeper than its first line an attempt's (or a line under it) continuation starts.
HANG = "    "


def item_lines(text: str, width: int | None, indent: str = "") -> list[str]:
    """One item of a run's page (its headline, an attempt, a service): wrapped between
    words at a terminal's ``width``, its continuation lines hanging (left to the terminal,
    a long line was cut inside words, its rest at the margin where it read as the next
    item); in a pipe one line (grep)."""
    if width is None:
        return [indent + text]
    return wrap(text, width, indent, HANG) or [indent]


def attempt_lines(row: Any, width: int | None = None) -> list[str]:
    """One run's attempts, one item each (shown under the table for a single run): one line
    in a pipe (``width`` None), wrapped to the terminal's width at a terminal."""
    lines = []
    for a in row.history:
        took = ""
        if a.get("start") and a.get("end"):
            took = f" {a['end'] - a['start']:.0f}s"
        started = time.strftime("%H:%M:%S", time.localtime(a["start"])) if a.get("start") else "?"
        resumed = a.get("resumed_from")
        origin = f"step {resumed}" if resumed is not None else "scratch"
        job = f"job {a['job_id']}" if a.get("job_id") else "local"
        if a.get("in_allocation"):
            job += " (restart in the allocation)"
        if a.get("shrunk"):
            job += f" (shrunk: {a['shrunk']})"
        text = (
            f"attempt {_num(a.get('attempt'))}: {job} on {a.get('nodes') or '?'} "
            f"at {started}{took}, from {origin} -> {a.get('cause')}"
        )
        if a.get("committed_step") is not None:
            text += f" (committed {a['committed_step']})"
        if a.get("blamed"):
            text += f", blamed {','.join(a['blamed'])}"
        why = [str(a[k]) for k in ("detail", "culprit") if a.get(k)]
        if why:
            text += ": " + "; ".join(why)
        under = [group_restart_line(g) for g in a.get("group_restarts") or ()]
        under += in_process_lines(a)
        if a.get("standbys"):
            from ddlaunch.app.status import standbys_line

            under.append(standbys_line(a["standbys"]))
        lines += item_lines(text, width)
        for line in under:
            lines += item_lines(line, width, "  ")
    return lines


def in_process_lines(attempt: dict[str, Any]) -> list[str]:
    """The attempt's in-process restarts, one line each (``app.status`` words them)."""
    entries = attempt.get("in_process_restarts") or ()
    if not entries:
        return []
    from ddlaunch.app.status import in_process_line

    return [in_process_line(e) for e in entries]


def group_restart_line(g: dict[str, Any]) -> str:
    """One replica group's failure inside an attempt (``app.status`` words it)."""
    from ddlaunch.app.status import group_restart_line as line

    return line(g)


def _said_above(row: Any) -> Any:
    """The row (a ``RunStatus``) whose failure the headline above the table says: its note
    leaves it out (said twice, a collective's error filled two screens' lines)."""
    return dataclasses.replace(row, failure=None, detail=None, failing=None)


def page(shown: Any, width: int | None) -> str:
    """Everything one poll prints (pure): the table, or why there is none, and the count of
    finished runs left out; one run's attempts under it."""
    rows = shown.rows
    if not rows and not shown.hidden:
        return f"no runs under {shown.root} (ddlaunch submit CONFIG to start one)"
    # The headline and the lines under the table wrap as the attempts do (``item_lines``):
    # left to the terminal, a long one was cut inside a word.
    lines = []
    if len(rows) == 1 and rows[0].failure:
        lines += item_lines(f"FAILED {ended_words(rows[0])}", width)
        rows = [_said_above(rows[0])]
    elif len(rows) == 1 and rows[0].failing:
        # Not the run's failure (it has not ended): what is known while the verdict is due.
        lines += item_lines(f"{rows[0].state}: {rows[0].failing}", width)
        rows = [_said_above(rows[0])]
    follow = len(rows) == 1 and bool(rows[0].history)
    if rows:
        lines.append(render(rows, width, shown.names, lines_follow=follow))
    if shown.hidden:
        what = plural(shown.hidden, "run")
        text = (
            f"{shown.hidden} older finished {what} not shown (ddlaunch status --all, or --since 7d)"
        )
        lines += textwrap.wrap(text, width) if width else [text]
    if follow:
        lines += attempt_lines(rows[0], width)
    if len(rows) == 1 and rows[0].services:
        for line in rows[0].services:
            lines += item_lines(f"service {line}", width)
    if len(rows) == 1 and rows[0].batch_shares:
        lines += item_lines(f"batch shares: {rows[0].batch_shares}", width)
    return "\n".join(lines)


def _parse_since(text: str | None) -> float | None:
    if text is None:
        return None
    from ddlaunch.app.status import look_back

    try:
        return look_back(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


@click.command("status")
@click.argument("runs", nargs=-1, metavar="[RUN|SWEEP]...", shell_complete=complete_targets)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (full run ids).")
@click.option("--all", "show_all", is_flag=True, help="Every run, however long ago it ended.")
@click.option("--since", metavar="AGE", help="Finished runs submitted within AGE (12h, 7d).")
@click.option(
    "--watch",
    is_flag=True,
    help="Poll again every --interval until interrupted, or until every RUN named has ended "
    "(exit 0 when all COMPLETED, 1 otherwise).",
)
@click.option(
    "--target",
    type=click.Choice(["slurm", "kubernetes"]),
    default="slurm",
    show_default=True,
    help="kubernetes: read the runs' state from their run directories alone (the pods' "
    "attempt records), asking no scheduler.",
)
@click.option(
    "--interval",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds between polls with --watch (never below $DDLAUNCH_MIN_POLL_S, default 30).",
)
def command(
    runs: tuple[str, ...],
    as_json: bool,
    show_all: bool,
    since: str | None,
    target: str,
    watch: bool,
    interval: float,
) -> None:
    """Show my runs (or the given RUNs or SWEEPs: id, id prefix, SWEEP/<i> or directory).

    Without arguments: every run that has not ended and the 20 latest that did (a sweep is
    one row; name it to see its members). The Slurm state comes from ONE squeue call per
    poll, for the runs that have not ended; step, checkpoint, attempts and their causes,
    node health and the first failing rank come from the run directories.
    """
    from ddlaunch.app.status import min_poll_interval
    from ddlaunch.app.status_poll import all_ended, view

    def poll() -> Any:
        return view(runs, show_all=show_all or bool(runs), since=_parse_since(since), target=target)

    if not watch:
        _show(poll(), as_json)
        return
    floor = min_poll_interval()
    if interval < floor:
        sys.stderr.write(
            f"--interval {interval:g} is below the floor of {floor:g} s ($DDLAUNCH_MIN_POLL_S): "
            f"polling every {floor:g} s\n"
        )
        interval = floor
    tty = sys.stdout.isatty() and not as_json
    with _interrupted():
        while True:
            shown = poll()
            if tty:  # redraw in place
                sys.stdout.write("\x1b[H\x1b[2J")
            if not as_json:
                stamp = time.strftime("%H:%M:%S")
                sys.stdout.write(f"polled {stamp}, every {interval:g} s (Ctrl-C to stop)\n")
            _show(shown, as_json)
            sys.stdout.flush()  # a pipe gets every poll as it comes, not at exit
            if runs and shown.rows and all_ended(shown.rows):
                # Named runs that all ended never change again: stop, as `logs -f` does,
                # with its exit status (0 only when every one COMPLETED).
                completed = all(r.state == "COMPLETED" for r in shown.rows)
                sys.stderr.write("every run named has ended; stopped watching\n")
                sys.exit(0 if completed else 1)
            time.sleep(interval)


def _show(shown: Any, as_json: bool) -> None:
    if as_json:
        # One line per document: a pipe reading `--watch --json` gets one per poll.
        indent = 2 if sys.stdout.isatty() else None
        sys.stdout.write(json.dumps([r.as_dict() for r in shown.rows], indent=indent) + "\n")
        return
    sys.stdout.write(page(shown, table_width()) + "\n")


class _interrupted:
    """Ctrl-C ends ``--watch`` quietly (exit 0): it is how the user stops watching."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        if kind is KeyboardInterrupt:
            sys.stdout.write("\n")
            return True
        return False
