"""No module of ddlaunch over 600 lines: a module that grows past it holds more than one
thing and is split by meaning (each module's docstring says what it owns), not by size."""

from __future__ import annotations

from pathlib import Path

import ddlaunch

MOST_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    root = Path(ddlaunch.__file__).parent
    sizes = {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    over = {name: lines for name, lines in sizes.items() if lines > MOST_LINES}
    assert not over, f"modules over {MOST_LINES} lines: {over}"
