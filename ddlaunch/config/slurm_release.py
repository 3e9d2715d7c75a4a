"""Slurm release strings (pure): ``23.11``, ``23.11.4`` or ``slurm 22.05.8`` -> ``(23, 11)``.

Here, below ``slurm/``, because the config reads them too: ``cluster.slurm_version`` gates the
``#SBATCH`` options a preset's Slurm has (``config.placement_rules``); ``slurm.queue`` picks
squeue's form with them.
"""

from __future__ import annotations


def version_tuple(version: str | None) -> tuple[int, int] | None:
    """The (major, minor) release; None when unknown or unreadable."""
    if not version or not version.strip():
        return None
    parts = version.strip().split()[-1].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def release(version: tuple[int, int]) -> str:
    """``(24, 5)`` -> ``"24.05"``, as Slurm spells its releases."""
    return f"{version[0]}.{version[1]:02d}"
