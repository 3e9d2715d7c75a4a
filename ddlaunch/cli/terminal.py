"""The one console wrapper. User strings are printed with markup off: rich would otherwise
treat ``[text]`` in job names, partitions or node lists as markup and eat it."""

from __future__ import annotations

import sys
from typing import Any


def table_width() -> int | None:
    """The terminal's width, for ``table.fit``; None when stdout is not a terminal (a pipe or
    a file gets one row per line, nothing shortened)."""
    if not sys.stdout.isatty():
        return None
    import shutil

    return shutil.get_terminal_size().columns  # $COLUMNS first, as ls and rich read it


class Terminal:
    def __init__(self, *, debug: bool = False):
        self.debug = debug
        self._console: Any = None
        self._err: Any = None

    @property
    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console  # lazy: rich costs ~40 ms to import

            self._console = Console(highlight=False)
        return self._console

    def out(self, text: str = "") -> None:
        """Plain text to stdout, byte for byte (scripts, argv, JSON)."""
        sys.stdout.write(text if text.endswith("\n") else text + "\n")

    def info(self, text: str) -> None:
        sys.stderr.write(text + "\n")

    def error(self, text: str) -> None:
        sys.stderr.write(f"error: {text}\n")

    def print(self, renderable: Any) -> None:
        self.console.print(renderable, markup=False)
