"""ddlaunch as a Python library: the use cases of the CLI with typed values in and out and
typed exceptions, never a print or an exit. ``import ddlaunch`` exposes all of it lazily::

    import ddlaunch

    run = ddlaunch.submit("examples/mlp", ["nodes.count=2"])
    final = run.wait()
    print(final.state, run.result)

Every module here imports only the standard library at import time; the application code
is imported by the call that needs it, so that ``import ddlaunch`` stays cheap and
torch-free.
"""

from __future__ import annotations

from ddlaunch.api.errors import WaitTimeout
from ddlaunch.api.launch import render, submit
from ddlaunch.api.listing import runs
from ddlaunch.api.run import Run
from ddlaunch.api.sweep import ArrayResult, Member, MemberState, Sweep, SweepStatus, sweep
from ddlaunch.api.values import Attempt, DryRun, RunStatus

__all__ = [
    "ArrayResult",
    "Attempt",
    "DryRun",
    "Member",
    "MemberState",
    "Run",
    "RunStatus",
    "Sweep",
    "SweepStatus",
    "WaitTimeout",
    "render",
    "runs",
    "submit",
    "sweep",
]
