"""Locate the shipped templates/ and configs/ folders.

In a source checkout (or an editable install) they are the top-level folders beside the
package; a regular install maps them into the package as ``ddlaunch/templates`` and
``ddlaunch/configs`` (see ``package_dir`` in setup.cfg).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def _find(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"ddlaunch installation is missing its {name}/ folder")


def templates_dir() -> Path:
    return _find("templates")


def configs_dir() -> Path:
    return _find("configs")


def package_root() -> str:
    """The directory holding the ``ddlaunch`` package that runs now (a checkout or
    site-packages): a container or a pod gets this very ddlaunch on its PYTHONPATH."""
    return str(_PACKAGE_DIR.parent)
