"""Where the ranks' stdout and stderr go (pure): one file per rank, or one per node.

One file per rank (``logs/rank-<R>.out|.err``) is what a person lists and opens by hand, and
what a job below 128 ranks keeps (``storage.rank_logs: auto``): at most 256 files. Above, it
is 32,000 files per run at 16,000 ranks, all created in one directory within seconds of the
step's start, from 2,000 nodes at once: a Lustre metadata server creates 15-27k files a
second in all (mdtest), and every later ``ls logs/`` or glob lists them. One file per node
(``logs/node-<host>.out|.err``, written by the node's slurmstepd) is 2 per node whatever the
ranks per node; srun's ``--label`` prefixes each line with its rank (``slurm.labels``), so
``ddlaunch logs --rank N`` still shows one rank's lines. Replica groups keep one file per
rank: each rank points its own output there (``worker.task.redirect_group_logs``).
"""

from __future__ import annotations

from ddlaunch.config.schema import Config

RANK_LOGS = "rank"
NODE_LOGS = "node"
# storage.rank_logs: auto writes one file per node above this many ranks (16 nodes of 8).
NODE_LOGS_ABOVE = 128


def rank_log_layout(cfg: Config) -> str:
    """``RANK_LOGS`` or ``NODE_LOGS`` for this config."""
    if cfg.fault_tolerance.mode == "replica_groups":
        return RANK_LOGS
    chosen = cfg.storage.rank_logs
    if chosen == "auto":
        return NODE_LOGS if cfg.world_size > NODE_LOGS_ABOVE else RANK_LOGS
    return NODE_LOGS if chosen == NODE_LOGS else RANK_LOGS
