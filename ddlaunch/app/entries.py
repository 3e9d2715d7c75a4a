"""The run root's entries by kind, for the shell completers (``cli.completion``): one
directory listing, never a run read, since a completer runs on every TAB."""

from __future__ import annotations

import os
from typing import Literal

from ddlaunch.store.rundir import CONFIG_FILE, default_run_root
from ddlaunch.store.sweeps import MEMBERS_FILE


def run_root_entries(kind: Literal["run", "sweep"]) -> list[str]:
    """The names of the run root's runs (a config file inside) or sweeps (a members file)."""
    root = default_run_root()
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    marker = CONFIG_FILE if kind == "run" else MEMBERS_FILE
    return [n for n in names if not n.startswith(".") and os.path.exists(root / n / marker)]
