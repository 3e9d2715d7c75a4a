"""Entry points of the real-Slurm sweep tests (imported on the compute nodes, with
``launch.workdir`` set to this folder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def mlp_fail_once(config: Any) -> dict[str, Any]:
    """The example MLP; a member with ``params.fail_once: true`` raises on its first run,
    before any checkpoint (a deterministic failure that a resubmission gets past)."""
    from ddlaunch.examples import mlp

    marker = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "failed-once"
    if config.params.get("fail_once") and not marker.exists():
        marker.write_text("")
        raise RuntimeError("deterministic failure (params.fail_once)")
    return mlp.main(config)
