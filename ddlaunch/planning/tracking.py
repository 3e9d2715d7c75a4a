"""Experiment-tracker variables that keep one tracker run across requeues (pure).

W&B: ``WANDB_RUN_ID`` is the ddlaunch run id, which every attempt, requeue and ``resume`` of
the run shares, and ``WANDB_RESUME=allow`` makes ``wandb.init`` continue that run when it
exists and create it when not (W&B docs, "Resume a run"; environment variables). A sweep's
array appends each member's number to the sweep id in the script.
"""

from __future__ import annotations

import re

from ddlaunch.config.schema import Config

# W&B refuses run ids with these characters (wandb 0.31, wandb_settings.py, the run id check).
_WANDB_RESERVED = re.compile(r"[:;,#?/']")


def wandb_run_id(run_id: str) -> str:
    return _WANDB_RESERVED.sub("-", run_id)


def tracking_env(cfg: Config, run_id: str) -> tuple[tuple[str, str], ...]:
    if not cfg.tracking.wandb:
        return ()
    return (("WANDB_RUN_ID", wandb_run_id(run_id)), ("WANDB_RESUME", "allow"))
