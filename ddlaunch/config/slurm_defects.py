"""Defects of Slurm releases that a job's config runs into (pure): a warning at submit names
the defect, the releases it was seen on and what avoids it. The release is the one Slurm
reported at submit (``sinfo --version``, ``app.facts.probe``), or where it was not asked (a
render), the preset's claim (``cluster.slurm_version``)."""

from __future__ import annotations

from ddlaunch.config.schema import Config
from ddlaunch.config.slurm_release import release, version_tuple

# slurmctld aborts ("double free or corruption", in gres_step_list_delete from
# free_step_record) when a step that holds GPUs (GRES) on a node removed from a --no-kill job
# ends: seen on Debian's 24.11.5 and 26.05.5 on the dev cluster (scripts/devcluster with
# DDL_DEVCLUSTER_SLURM; reproduced with a plain sbatch script, no ddlaunch), not on 22.05.8,
# and not for a step without GRES. The controller stays down until restarted, the job's
# state since its last save is lost, and every user of the cluster waits.
GRES_STEP_ON_LOST_NODE = frozenset({(24, 11), (26, 5)})


def defect_warnings(cfg: Config, slurm_version: str | None) -> list[str]:
    """The warnings for ``cfg`` on Slurm ``slurm_version`` (None: not asked, the preset's
    ``cluster.slurm_version`` then; neither: nothing is said)."""
    version = version_tuple(slurm_version or cfg.cluster.slurm_version)
    if version is None:
        return []
    out = []
    gpus = cfg.nodes.gpus_per_node or any(c.nodes.gpus_per_node for c in cfg.components)
    if version in GRES_STEP_ON_LOST_NODE and cfg.elastic and gpus:
        out.append(
            f"Slurm {release(version)}: a node lost by this job (it keeps its allocation: "
            "--no-kill, for fault_tolerance's spare_nodes, nodes.min or replica groups) can "
            "crash slurmctld when the GPU step that ran there ends (a double free in "
            "gres_step_list_delete, seen on 24.11.5 and 26.05.5, not on 22.05); ask the "
            "cluster's admins whether their release has it, or set "
            "fault_tolerance.spare_nodes: 0 and nodes.min to nodes.count (a requeue instead)"
        )
    return out
