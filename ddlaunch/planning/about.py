"""What is said about a plan rather than run: the script's comment lines (the parallelism
placement with its rank map and communication estimate, the data staging, what each rank
runs) and the warnings ``render`` and ``submit`` print.

A plan carries an ``About`` and asks it on first use: each text is worked out once, by the
template or the verb that shows it, and never for a plan nobody shows (a sweep's probes, a
plan compared and dropped). ``describe`` is imported only for a config that has something to
describe.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ddlaunch.config.schema import Config
from ddlaunch.planning.rank_step import rank_command
from ddlaunch.wording import counted


@dataclass(frozen=True, eq=False)
class About:
    """``cfg``: the validated config the plan was made from; ``run_dir``: the run's directory,
    None for a job array (each member's is known only at run time). None of it is part of the
    plan's value (``LaunchPlan.about`` is neither compared nor shown in its repr)."""

    cfg: Config | None = None
    run_dir: str | None = None

    @cached_property
    def _described(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(notes, warnings), worked out together: the warnings are among the notes."""
        cfg = self.cfg
        if cfg is None or (not cfg.parallel.configured and not cfg.storage.stage):
            return (), ()
        from ddlaunch.planning import describe

        notes, warnings = describe.described(cfg)
        return tuple(notes), tuple(warnings)

    @property
    def notes(self) -> tuple[str, ...]:
        """Comment lines of the script: the parallelism placement and the data staging."""
        return self._described[0]

    @property
    def warnings(self) -> tuple[str, ...]:
        """Valid but slow choices, or checks left out, or a job that asks for no GPU on nodes
        that have some: printed by render and submit (not in the script's comments)."""
        cpu = cpu_job_warning(self.cfg) if self.cfg is not None else None
        return (*([cpu] if cpu else []), *self._described[1])

    @cached_property
    def rank_command(self) -> str:
        """What each rank runs, for the script's comment."""
        return rank_command(self.cfg, self.run_dir) if self.cfg is not None else ""


def cpu_job_warning(cfg: Config) -> str | None:
    """A job that asks for no GPU (``nodes.gpus_per_node: 0``) on a cluster whose preset says
    its nodes have GPUs: its ranks run on CPUs, which a 0 typed by mistake would not say.

    Said only where the preset names the nodes' GPUs (``cluster.gpus_per_node`` > 0). A CPU
    cluster by design (``cluster.gpus_per_node: 0``) and a config with no cluster preset (its
    nodes unknown, ``gpus_per_node``'s default 0 a plain CPU job) say nothing; nor does a job
    that gets its GPUs through ``sbatch:`` (``gres: gpu:N``, ``gpus``), nor one with
    ``components:`` (each component names its own GPUs; a service on CPUs is by design)."""
    have = cfg.cluster.gpus_per_node
    if cfg.nodes.gpus_per_node or not have or cfg.components or _sbatch_gpus(cfg):
        return None
    ranks, tasks = cfg.ranks_per_node, cfg.nodes.tasks_per_node
    why = f"nodes.tasks_per_node={tasks}" if tasks else "nodes.tasks_per_node unset"
    return (
        f"nodes.gpus_per_node is 0: the job asks for no GPUs and runs {counted(ranks, 'rank')} "
        f"per node on CPUs ({why}), though a node of {cfg.cluster.name!r} has "
        f"{counted(have, 'GPU')}"
    )


def _sbatch_gpus(cfg: Config) -> bool:
    """``sbatch:`` asks for GPUs itself: a ``gpu`` gres, or a ``gpus*`` option."""
    if any(str(key).startswith("gpus") for key in cfg.sbatch):
        return True
    gres = cfg.sbatch.get("gres")
    entries = gres.split(",") if isinstance(gres, str) else []
    return any(e.strip().split(":", 1)[0].removeprefix("gres/") == "gpu" for e in entries)
