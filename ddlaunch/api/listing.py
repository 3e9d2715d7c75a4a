"""``runs``: my runs, as ``ddlaunch status --json`` lists them (``app.status_poll.view``:
the run directories and ONE squeue call for those that have not ended)."""

from __future__ import annotations

import os
from pathlib import Path

from ddlaunch.api.values import RunStatus


def runs(
    since: float | str | None = None,
    all: bool = False,
    *,
    run_root: str | os.PathLike[str] | None = None,
) -> list[RunStatus]:
    """Every run under the run root that has not ended, and the 20 latest that did (a sweep
    is one row), oldest first: ``ddlaunch status --json``.

    ``all``: every finished run too. ``since``: instead of the 20 latest, the finished runs
    submitted within this age (seconds, or a duration such as ``"12h"`` or ``"7d"``).
    ``run_root``: default ``$DDLAUNCH_RUN_ROOT`` or the built-in root.
    """
    from ddlaunch.app.status_poll import view

    root = Path(run_root) if run_root is not None else None
    shown = view((), show_all=all, since=_seconds(since), root=root)
    return [RunStatus.from_row(row) for row in shown.rows]


def _seconds(since: float | str | None) -> float | None:
    if since is None or isinstance(since, int | float):
        return since
    from ddlaunch.app.status import look_back
    from ddlaunch.errors import UserError

    try:
        return look_back(since)
    except ValueError as exc:
        raise UserError(f"since: {exc}") from None
