"""The process entry of the ``ddlaunch`` console script and of ``python -m ddlaunch``.

A command lives for a fraction of a second and allocates many small, acyclic objects
(imported modules, a thousand status rows). With the default threshold the cyclic garbage
collector runs some fifty passes over them, about a tenth of ``status`` and ``render``,
and frees almost nothing. A high first-generation threshold keeps the collector for
long-running modes (``status --watch``, ``submit --local``) without those passes. This is
set here, not in ``ddlaunch.cli``, so that importing the CLI (tests do) changes nothing.
"""

from __future__ import annotations

import gc
import sys

GC_THRESHOLD = (100_000, 50, 50)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLD)  # before the imports, which allocate the most
    try:
        from ddlaunch.cli import main as cli_main
    except KeyboardInterrupt:
        # Ctrl-C while the CLI itself loads, before its own handling is in place: one line,
        # as it says later, not a traceback of the imports.
        sys.stderr.write("interrupted (SIGINT)\n")
        sys.exit(130)
    cli_main()
