"""Locate the templates and presets ddlaunch ships as package data.

``ddlaunch/templates/`` (the sbatch template and its partials) and ``ddlaunch/configs/`` (the
cluster presets, examples and sweeps) sit inside the package, in a checkout as in an installed
wheel, so that the tree the tests run is the tree users install.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def _find(name: str) -> Path:
    candidate = _PACKAGE_DIR / name
    if not candidate.is_dir():
        # A broken install (or a container that mounts the Python modules only).
        raise FileNotFoundError(f"ddlaunch installation is missing its {name}/ folder")
    return candidate


def templates_dir() -> Path:
    return _find("templates")


def configs_dir() -> Path:
    return _find("configs")


def package_dir() -> Path:
    """The directory of the ``ddlaunch`` package that runs now."""
    return _PACKAGE_DIR


def package_root() -> str:
    """The directory holding the ``ddlaunch`` package that runs now (a checkout or
    site-packages): a container or a pod gets this very ddlaunch on its PYTHONPATH."""
    return str(_PACKAGE_DIR.parent)
