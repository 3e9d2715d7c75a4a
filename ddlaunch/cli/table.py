"""A table that fits the terminal without wrapping its key columns (pure: cells -> lines).

``fit(columns, rows, width)``: with ``width=None`` (output into a pipe or a file) every row is
one line, columns aligned, nothing shortened. At a terminal's width, in this order, until the
row fits:

1. ``shrink`` columns (run ids) are shortened in the middle, never below their
   ``min_width`` (the caller sets it so that a unique prefix of each id stays readable);
2. ``detail`` columns (nodes, then the counts) move, lowest ``rank`` first, onto a line
   under the row; the room they leave goes back to the ``shrink`` columns, so that an id
   keeps as much of itself as fits (all of it when it does);
3. the ``note`` column stays on the row only if it gets at least ``NOTE_MIN`` characters,
   wrapped within its column; otherwise it joins the line under the row, wrapped to the
   terminal's width.

``fixed`` columns (state, job, step) are never shortened, wrapped or moved.
"""

from __future__ import annotations

import bisect
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

GAP = "  "
NOTE_MIN = 24
ELLIPSIS = "…"
TAIL = 4  # characters kept at the end of a shortened cell (a run id's random suffix)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str = "fixed"  # fixed | shrink | detail | note
    right: bool = False  # right-aligned (numbers)
    min_width: int = 0  # shrink columns: never narrower
    rank: int = 0  # detail columns: the lowest moves out first


def shorten_middle(text: str, width: int) -> str:
    """``mlp-example-2026…0fda``: the head and the last ``TAIL`` characters."""
    if len(text) <= width:
        return text
    if width <= TAIL + 1:
        return text[:width]
    return text[: width - TAIL - 1] + ELLIPSIS + text[-TAIL:]


def _natural(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c.name), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]


def _total(widths: Sequence[int], keep: Sequence[int]) -> int:
    return sum(widths[i] for i in keep) + len(GAP) * max(len(keep) - 1, 0)


def _line(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
    return GAP.join(parts).rstrip()


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None) -> list[str]:
    """The table's lines: a header, then each row (and, at a narrow width, the line of its
    moved-out cells under it). A note column whose cells are all empty is left out."""
    note = next((i for i, c in enumerate(columns) if c.kind == "note"), None)
    if note is not None and not any(r[note] for r in rows):
        columns = [c for i, c in enumerate(columns) if i != note]
        rows = [[cell for i, cell in enumerate(r) if i != note] for r in rows]
        note = None
    widths = _natural(columns, rows)
    others = [i for i in range(len(columns)) if i != note]
    if width is None:
        return _plain(columns, rows, widths, others, note)
    natural = list(widths)
    inline = list(others)
    shrink = [i for i in inline if columns[i].kind == "shrink"]
    excess = _total(widths, inline) - width
    for i in shrink:
        if excess > 0:
            cut = min(excess, widths[i] - max(columns[i].min_width, len(columns[i].name)))
            widths[i] -= max(cut, 0)
            excess -= max(cut, 0)
    for i in sorted(
        (i for i in inline if columns[i].kind == "detail"), key=lambda i: columns[i].rank
    ):
        if excess > 0:
            inline.remove(i)
            excess = _total(widths, inline) - width
    # The ids were cut for a row that still held the details; with some of those moved under
    # it, their room goes back to the ids (cut to ``u…3380`` beside a short row otherwise),
    # before the note: a note wraps whole, a shortened id has lost characters.
    for i in shrink:
        back = min(max(-excess, 0), natural[i] - widths[i])
        widths[i] += back
        excess += back
    note_width = width - _total(widths, inline) - len(GAP)
    note_inline = note is not None and note_width >= NOTE_MIN
    if note is not None and note_inline:
        widths[note] = min(widths[note], note_width)
        inline.append(note)
    moved = [i for i in range(len(columns)) if i not in inline]
    right = [columns[i].right for i in inline]
    lines = [_line([columns[i].name for i in inline], [widths[i] for i in inline], right)]
    for row in rows:
        cells = [shorten_middle(row[i], widths[i]) for i in inline]
        if note_inline and note is not None:
            wrapped = wrap(row[note], widths[note]) or [""]
            cells[-1] = wrapped[0]
            lines.append(_line(cells, [widths[i] for i in inline], right))
            indent = " " * (_total(widths, inline[:-1]) + len(GAP))
            lines += [indent + more for more in wrapped[1:]]
        else:
            lines.append(_line(cells, [widths[i] for i in inline], right))
        below = [
            row[i] if columns[i].kind == "note" else f"{columns[i].name} {row[i]}"
            for i in moved
            if row[i] not in ("", "-")
        ]
        if below:
            lines += wrap("; ".join(below), width, "  ")
    return lines


def wrap(text: str, width: int, indent: str = "", hang: str = "") -> list[str]:
    """``text`` in lines of at most ``width``, broken between words; each line starts with
    ``indent``, the continuation lines with ``hang`` after it (one item reads as one)."""
    # Not at hyphens: run ids and node names are full of them.
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + hang,
        break_on_hyphens=False,
    )


def _plain(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    widths: Sequence[int],
    others: Sequence[int],
    note: int | None,
) -> list[str]:
    """One line per row, aligned, nothing shortened (a pipe, a file, a script)."""
    order = [*others, *([note] if note is not None else [])]
    right = [columns[i].right for i in order]
    sized = [widths[i] for i in order]
    return [
        _line([columns[i].name for i in order], sized, right),
        *(_line([row[i] for i in order], sized, right) for row in rows),
    ]


def unique_prefixes(names: Sequence[str], among: Sequence[str] = ()) -> dict[str, int]:
    """Each of ``names``' shortest prefix that no other name (of ``names`` and ``among``: the
    whole run root) starts with, as its length: a shortened run id keeps it, so the id can
    still be typed back as a prefix. Sorted neighbours are the only rivals (bisect)."""
    ordered = sorted({*names, *among})
    out: dict[str, int] = {}
    for name in set(names):
        i = bisect.bisect_left(ordered, name)
        longest = 0
        for other in (
            ordered[i - 1] if i > 0 else "",
            ordered[i + 1] if i + 1 < len(ordered) else "",
        ):
            common = 0
            for a, b in zip(name, other, strict=False):
                if a != b:
                    break
                common += 1
            longest = max(longest, common)
        out[name] = min(longest + 1, len(name))
    return out
