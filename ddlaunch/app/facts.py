"""Cluster facts, probed once at the edge of a command (``planning.plan.ClusterFacts``): the
partitions with their nodes and limits (one sinfo call), the release (``sinfo --version``)
and, for sweeps, MaxArraySize. The
planning code gets them passed in and never asks Slurm itself."""

from __future__ import annotations

import shutil

from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.slurm.client import SlurmClient, SlurmError, default_timeout

# The probe is a courtesy: when Slurm does not answer within this, submit goes on without it
# (sbatch then fails on its own timeout, and the intent records why).
PROBE_TIMEOUT_S = 15.0


def probe(max_array_size: bool = False) -> tuple[ClusterFacts, list[str]]:
    """The facts, and a warning when Slurm could not be asked (nothing then is checked)."""
    if shutil.which("sinfo") is None:
        return ClusterFacts(), []
    client = SlurmClient(timeout=min(PROBE_TIMEOUT_S, default_timeout()))
    try:
        partitions = tuple(client.partitions())
    except SlurmError as exc:
        return ClusterFacts(), [
            f"could not ask Slurm for its partitions and nodes ({exc.detail}); nothing "
            "is checked against them"
        ]
    size = None
    if max_array_size:
        size = client.max_array_size()
    version = client.slurm_version()
    return ClusterFacts(slurm_version=version, max_array_size=size, partitions=partitions), []


def sweep_facts(
    max_array_size: int | None, offline: bool = False
) -> tuple[ClusterFacts, list[str]]:
    """A sweep's facts: the partitions and MaxArraySize (capped by ``max_array_size``, the
    option), and the probe's warnings. ``offline`` (--dry-run): nothing is asked of Slurm
    but MaxArraySize."""
    import dataclasses

    warnings: list[str] = []
    if offline:
        probed = SlurmClient().max_array_size() if shutil.which("scontrol") else None
        facts = ClusterFacts(max_array_size=probed)
    else:
        facts, warnings = probe(max_array_size=True)
    sizes = [s for s in (facts.max_array_size, max_array_size) if s]
    return dataclasses.replace(facts, max_array_size=min(sizes) if sizes else None), warnings
