"""What a plan is made from besides the config, each decided at the edge and passed in: the
cluster's probed facts, where the ranks' code comes from, ``submit --after``'s edges, and a
sweep's job array (pure values, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# Only as types: ``render`` imports this module, and each module costs it start-up time
# (policy.chain alone builds eight dataclasses).
if TYPE_CHECKING:
    from ddlaunch.policy.chain import Edge
    from ddlaunch.slurm.partitions import PartitionFacts


@dataclass(frozen=True)
class ArraySpec:
    """A job array of sweep members: task ``t`` runs member ``members[t]``.

    Array indices are positions in ``members`` (always ``0..len-1``): Slurm caps the highest
    index at MaxArraySize - 1, so a split sweep or a resubmission of scattered members cannot
    use the member numbers themselves as indices. Each member is a normal run directory,
    ``<members_dir>/<member>``, chosen by the script at run time.
    """

    name: str  # the array's script is <run_dir>/arrays/<name>.sbatch
    sweep_id: str
    members: tuple[int, ...]
    members_dir: str
    throttle: int | None = None  # at most this many tasks of the array run at once
    # Checkpoints of member m: <checkpoint_root>/m when storage.checkpoint_dir is set,
    # else <member run dir>/checkpoints.
    checkpoint_root: str | None = None

    @property
    def spec(self) -> str:
        """The ``--array`` value: ``0-N`` plus ``%throttle``."""
        if not self.members:
            raise ValueError("a job array needs at least one member")
        last = len(self.members) - 1
        indices = "0" if last == 0 else f"0-{last}"
        return f"{indices}%{self.throttle}" if self.throttle else indices


@dataclass(frozen=True)
class ClusterFacts:
    """What was probed from the cluster at the edge (all optional: rendering works offline).
    ``partitions``: every partition's nodes and limits (one sinfo call; empty: not probed),
    for ``planning.feasibility``."""

    slurm_version: str | None = None
    max_array_size: int | None = None
    partitions: tuple[PartitionFacts, ...] = ()


@dataclass(frozen=True)
class CodePaths:
    """Where the ranks' code comes from, decided at the edge (``app.snapshot``, ``app.prepare``).

    ``snapshot``: the stored code snapshot the ranks run from (None: the live directory);
    ``workdir``: the ranks' working directory (inside the snapshot when there is one);
    ``ddlaunch_root``: the directory holding the ``ddlaunch`` package that renders the script
    (mounted into a container); ``home``: the user's home (podman's container.mount_home)."""

    snapshot: str | None = None
    workdir: str | None = None
    ddlaunch_root: str | None = None
    home: str | None = None


@dataclass(frozen=True)
class After:
    """``submit --after``'s part of a plan, decided at the edge (``app.chain``): the edges
    onto the predecessors' jobs (joined after ``job.dependency``), and each predecessor's
    run directory for the ranks (``DDLAUNCH_AFTER_<NAME>_DIR``). A resumed dependent keeps
    the directories, not the edges: it waited once already."""

    edges: tuple[Edge, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
