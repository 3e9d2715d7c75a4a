"""ddlaunch: a Slurm-integrated launcher for distributed PyTorch training.

Importing this package is cheap on purpose: login-node commands (``--help``, ``render``,
``status``, ``logs``, ``resume``) must never pull in torch. The Python API
(``ddlaunch.submit``, ``ddlaunch.Run``, ...: ``ddlaunch.api``) and the errors it raises are
attributes loaded on first use, so a CLI verb pays nothing for them. Their types are in
``__init__.pyi``: imported here, even under TYPE_CHECKING, they would make every module that
reads ``ddlaunch.__version__`` depend on the whole API (``lint-imports`` counts such imports).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# name -> the module that defines it, imported when the name is first asked for.
_LAZY = {
    "ArrayResult": "ddlaunch.api",
    "Member": "ddlaunch.api",
    "MemberState": "ddlaunch.api",
    "Sweep": "ddlaunch.api",
    "SweepStatus": "ddlaunch.api",
    "sweep": "ddlaunch.api",
    "Attempt": "ddlaunch.api",
    "DryRun": "ddlaunch.api",
    "Run": "ddlaunch.api",
    "RunStatus": "ddlaunch.api",
    "WaitTimeout": "ddlaunch.api",
    "render": "ddlaunch.api",
    "runs": "ddlaunch.api",
    "submit": "ddlaunch.api",
    "UserError": "ddlaunch.errors",
    "ConfigError": "ddlaunch.config.errors",
    "SlurmError": "ddlaunch.slurm.client",
    "SlurmUnreachable": "ddlaunch.slurm.client",
}

__all__ = [
    "ArrayResult",
    "Attempt",
    "ConfigError",
    "DryRun",
    "Member",
    "MemberState",
    "Run",
    "RunStatus",
    "SlurmError",
    "SlurmUnreachable",
    "Sweep",
    "SweepStatus",
    "UserError",
    "WaitTimeout",
    "__version__",
    "render",
    "runs",
    "submit",
    "sweep",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ddlaunch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
