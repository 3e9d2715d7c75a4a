"""The variables a pod of ``--target kubernetes`` carries, and who the pod is (pure).

The manifest (``planning.kubernetes``) sets them, some through the downward API (the Job's
completion index, the JobSet's restart attempt, the PyTorchJob's replica index); the pod entry
(``job.pod``) adds the local rank of each process it starts; the ranks read them back through
``worker.distenv``. One module names them all, so the three cannot disagree.

A pod's node index is its Job's completion index plus ``NODE_OFFSET_VAR``: 1 for a
PyTorchJob's Workers (the Master is node 0), and with ``components:`` the nodes of the train
components before the pod's own (each train component is a replicated job of its own whose
completion indexes start at 0). The train components start as many ranks per node (validated),
so the node offset makes the ranks one world numbered component by component, as Slurm's
``--het-group`` step does: rank = (offset + completion index) x ranks per node + local rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddlaunch.store.layout import KUBERNETES_JOB_VAR, KUBERNETES_RESTART_VAR

EXECUTOR = "kubernetes"  # SUBMITIT_EXECUTOR in the pods (the ranks' "where am I")
JOB_VAR = KUBERNETES_JOB_VAR  # the JobSet's or PyTorchJob's name
RESTART_VAR = KUBERNETES_RESTART_VAR  # the attempt (JobSet: its restart-attempt annotation)
KIND_VAR = "DDLAUNCH_K8S_KIND"  # jobset | pytorchjob
NODE_INDEX_VAR = "DDLAUNCH_K8S_NODE_INDEX"  # the Job completion index / the replica index
NODE_OFFSET_VAR = "DDLAUNCH_K8S_NODE_OFFSET"  # PyTorchJob Workers: 1; a component: its offset
COMPONENT_VAR = "DDLAUNCH_K8S_COMPONENT"  # components: the train component of the pod
NODES_VAR = "DDLAUNCH_K8S_NODES"
RANKS_PER_NODE_VAR = "DDLAUNCH_K8S_RANKS_PER_NODE"
LOCAL_RANK_VAR = "DDLAUNCH_K8S_LOCAL_RANK"  # set by the pod entry for each rank it starts
MASTER_ADDR_VAR = "DDLAUNCH_K8S_MASTER_ADDR"  # node 0's stable DNS name
NODE_NAME_VAR = "DDLAUNCH_K8S_NODE"  # spec.nodeName: the node the pod runs on


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value in (None, ""):
        if default is None:
            raise ValueError(f"{name} is not set: not a pod rendered by ddlaunch")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


@dataclass(frozen=True)
class PodIdentity:
    """Node ``index`` of ``nodes``, with ``ranks_per_node`` ranks, rendezvous at ``master``."""

    index: int
    nodes: int
    ranks_per_node: int
    master: str
    job: str
    kind: str
    component: str = ""  # components: the pod's train component

    @property
    def leader(self) -> bool:
        return self.index == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PodIdentity:
        index = _int(env, NODE_INDEX_VAR) + _int(env, NODE_OFFSET_VAR, 0)
        nodes = _int(env, NODES_VAR)
        if not 0 <= index < nodes:
            raise ValueError(f"node index {index} is outside 0..{nodes - 1}")
        master = env.get(MASTER_ADDR_VAR) or ""
        if not master:
            raise ValueError(f"{MASTER_ADDR_VAR} is not set: not a pod rendered by ddlaunch")
        return cls(
            index=index,
            nodes=nodes,
            ranks_per_node=_int(env, RANKS_PER_NODE_VAR),
            master=master,
            job=env.get(JOB_VAR, ""),
            kind=env.get(KIND_VAR, "jobset"),
            component=env.get(COMPONENT_VAR, ""),
        )
