"""Counts in English: ``1 restart``, ``2 restarts``, ``1 of them is``, ``3 of them are``.

A message that puts a number before a noun or a verb takes the word's number from the count,
here and nowhere else, so that no output reads "1 restarts". A leaf: every layer may import
it, the ranks and the batch host included.
"""

from __future__ import annotations


def plural(count: float, one: str, many: str = "") -> str:
    """The word for ``count`` things: ``one`` for exactly one, else ``many`` (``one`` + "s"
    unless given: ``plural(n, "entry", "entries")``, ``plural(n, "is", "are")``). Zero, and
    a fraction such as 1.5, take the plural, as English does: "0 restarts", "1.5 steps"."""
    if count == 1:
        return one
    return many or one + "s"


def counted(count: int, one: str, many: str = "") -> str:
    """``count`` and its noun in the right number: ``1 restart``, ``0 restarts``."""
    return f"{count} {plural(count, one, many)}"
