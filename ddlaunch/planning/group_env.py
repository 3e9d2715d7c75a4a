"""The environment of a rank in ``fault_tolerance.mode: replica_groups`` (pure, torch-free).

The batch host's group supervisor (``ddlaunch.job.groups``) starts one srun step per replica
group; each step is its own torch.distributed world (the group's ranks, numbered from 0, its
first node the master) and these variables tell its ranks which group they are and where the
torchft lighthouse listens. The first four are torchft's own names, so a script that builds
torchft's ``Manager`` itself reads them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GROUP_ID_VAR = "REPLICA_GROUP_ID"
NUM_GROUPS_VAR = "NUM_REPLICA_GROUPS"
LIGHTHOUSE_VAR = "TORCHFT_LIGHTHOUSE"
MANAGER_PORT_VAR = "TORCHFT_MANAGER_PORT"
# The job-wide rank of the group's rank 0: records (failure records, heartbeats, rank logs)
# name ranks job-wide, so two groups' rank 0 never share a name.
RANK_OFFSET_VAR = "DDLAUNCH_GROUP_RANK_OFFSET"
# How many times this group's step was started in this attempt (0: its first start).
GROUP_RESTART_VAR = "DDLAUNCH_GROUP_RESTART"


@dataclass(frozen=True)
class GroupIdentity:
    group: int
    groups: int
    lighthouse: str
    rank_offset: int
    restart: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GroupIdentity | None:
        """This rank's group, or None outside replica groups (no ``REPLICA_GROUP_ID``)."""
        if not environ.get(GROUP_ID_VAR):
            return None
        return cls(
            group=int(environ[GROUP_ID_VAR]),
            groups=int(environ.get(NUM_GROUPS_VAR, "1")),
            lighthouse=environ.get(LIGHTHOUSE_VAR, ""),
            rank_offset=int(environ.get(RANK_OFFSET_VAR, "0")),
            restart=int(environ.get(GROUP_RESTART_VAR, "0")),
        )

    def env(self, manager_port: int) -> dict[str, str]:
        """The variables the supervisor gives the group's step."""
        return {
            GROUP_ID_VAR: str(self.group),
            NUM_GROUPS_VAR: str(self.groups),
            LIGHTHOUSE_VAR: self.lighthouse,
            MANAGER_PORT_VAR: str(manager_port),
            RANK_OFFSET_VAR: str(self.rank_offset),
            GROUP_RESTART_VAR: str(self.restart),
        }


def job_rank(environ: Mapping[str, str]) -> int | None:
    """A replica group's rank numbered job-wide (the offset + its srun task id), None
    outside replica groups: what its records, rank logs and result file are named by."""
    ident = GroupIdentity.from_env(environ)
    task = environ.get("SLURM_PROCID")
    if ident is None or task is None:
        return None
    return ident.rank_offset + int(task)
