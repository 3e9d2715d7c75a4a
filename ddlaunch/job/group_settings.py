"""The replica groups' supervisor's settings (``job.groups``): the run's config, read from the
run directory as the end hook reads it (``load_config``: validated, the schema's defaults the
only ones), and its command line, which is the script's srun argv and each rank's command
only (``split_command``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.config.parallel import degrees_of
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import load_config
from ddlaunch.policy.heartbeats import Thresholds
from ddlaunch.store.rundir import config_path

# Where the worker's argv starts in the supervisor's command line (after srun's argv).
WORKER_MARK = "--ddlaunch-worker"


@dataclass(frozen=True)
class Settings:
    """What the supervisor runs by: the run's config (``from_config``) and its command line
    (``srun``: the script's srun argv; ``worker``: each rank's command). ``watch``: the hang
    and straggler verdicts are on (``health.watchdog``)."""

    groups: int
    ranks_per_node: int
    min_groups: int
    max_restarts: int
    heal_timeout: float
    bad_node_ttl_hours: float
    thresholds: Thresholds
    watch: bool
    srun: tuple[str, ...]
    worker: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: Config, srun: Sequence[str], worker: Sequence[str]) -> Settings:
        ft, health = cfg.fault_tolerance, cfg.health
        return cls(
            groups=degrees_of(cfg).dp_replicate,
            ranks_per_node=cfg.ranks_per_node,
            min_groups=ft.min_replica_groups,
            max_restarts=ft.max_restarts,
            heal_timeout=ft.heal_timeout,
            bad_node_ttl_hours=health.bad_node_ttl_hours,
            thresholds=Thresholds.of(health),
            watch=health.watchdog,
            srun=tuple(srun),
            worker=tuple(worker),
        )

    @classmethod
    def of_run(cls, run_dir: Path, srun: Sequence[str], worker: Sequence[str]) -> Settings:
        """The run's settings, read as every batch-host hook reads the run's config
        (``load_config``: validated, with the schema's defaults). Unlike the hooks', no
        defaults stand in for a config that cannot be read: the groups' count is in it."""
        return cls.from_config(load_config(config_path(run_dir)), srun, worker)


def split_command(argv: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``[--] SRUN... --ddlaunch-worker WORKER...`` -> (srun's argv, the worker's)."""
    rest = list(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if WORKER_MARK not in rest:
        raise SystemExit(
            f"usage: python -m ddlaunch.job.groups [--] SRUN... {WORKER_MARK} WORKER...\n"
            f"error: the command line needs SRUN... {WORKER_MARK} WORKER..."
        )
    cut = rest.index(WORKER_MARK)
    return tuple(rest[:cut]), tuple(rest[cut + 1 :])
