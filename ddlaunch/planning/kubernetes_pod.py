"""The pod of ``--target kubernetes`` (pure): one per node, one container running ddlaunch's
pod entry, which starts one rank per GPU (``job.pod``).

Built as plain data, serialised by ``planning.kubernetes``. What it holds, and why:

* ``resources``: ``nodes.gpus_per_node`` of ``kubernetes.gpu_resource``, the RDMA devices the
  cluster preset names (``kubernetes.rdma``), CPUs (ranks x ``topology.cpus_per_task``) and
  memory (``nodes.mem`` & co., Slurm's 1024-based units) when known, then
  ``kubernetes.resources`` on top. CPU is requested, never limited (a CFS quota would throttle
  the ranks); everything else is also the limit (extended resources must be).
* a memory-backed ``emptyDir`` on ``/dev/shm`` (the container runtime's 64 MiB default breaks
  NCCL's shared-memory transport and DataLoader workers), 4Gi per rank unless
  ``kubernetes.shm_size``;
* ``kubernetes.volumes`` at their mount paths (the run directory lives on one), an
  ``emptyDir`` at ``storage.scratch`` when no volume covers it;
* one pod per node: a required pod anti-affinity on ``kubernetes.io/hostname`` among the
  job's pods;
* tolerations: ``kubernetes.tolerations``, and ``node.kubernetes.io/unreachable`` /
  ``not-ready`` for ``kubernetes.node_*_seconds`` instead of the 300 s that the
  DefaultTolerationSeconds admission plugin adds otherwise;
* ``terminationGracePeriodSeconds`` = ``fault_tolerance.signal_lead``: on deletion (a restart,
  Kueue preemption, a drain) the pod entry passes SIGTERM to the ranks, which save first;
* ``IPC_LOCK`` when RDMA devices are requested (verbs pin memory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypeAlias

from ddlaunch.config.kubernetes_rules import parse_toleration, parse_volume
from ddlaunch.config.schema import Config
from ddlaunch.planning import topology

# A JSON document as the manifests are built: any value ``json.dumps`` (and YAML) writes.
# Read-only containers inside (a ``dict[str, str]`` of labels is a JSON object too); the
# objects built here are mutable ``JSONObject``s.
JSONValue: TypeAlias = (
    "str | int | float | bool | Sequence[JSONValue] | Mapping[str, JSONValue] | None"
)
JSONObject: TypeAlias = dict[str, JSONValue]

SHM_PER_RANK_GI = 4
_SLURM_UNITS = {"K": "Ki", "M": "Mi", "G": "Gi", "T": "Ti"}
_SIZE = re.compile(r"^([0-9]+)([KMGT]?)$")


def _gib_quantity(slurm: str, times: int = 1) -> str | None:
    """A Slurm size (``16G``; a bare number is megabytes) times ``times``, as a quantity."""
    match = _SIZE.match(slurm)
    if not match or int(match[1]) == 0:
        return None  # 0 means "all of the node" to Slurm: no request here
    return f"{int(match[1]) * times}{_SLURM_UNITS[match[2] or 'M']}"


def requests(cfg: Config) -> dict[str, str]:
    """What the pod asks for, before ``kubernetes.resources``' overrides."""
    nodes, k = cfg.nodes, cfg.kubernetes
    out: dict[str, str] = {}
    cpus = topology.cpus_per_task(cfg)
    if cpus:
        out["cpu"] = str(cpus * cfg.ranks_per_node)
    memory = None
    if nodes.mem:
        memory = _gib_quantity(nodes.mem)
    elif nodes.mem_per_gpu:
        memory = _gib_quantity(nodes.mem_per_gpu, nodes.gpus_per_node)
    elif nodes.mem_per_cpu and cpus:
        memory = _gib_quantity(nodes.mem_per_cpu, cpus * cfg.ranks_per_node)
    if memory:
        out["memory"] = memory
    if nodes.gpus_per_node:
        out[k.gpu_resource] = str(nodes.gpus_per_node)
    out.update(k.rdma)
    out.update(k.resources)
    return out


def resources(cfg: Config) -> dict[str, dict[str, str]]:
    wanted = requests(cfg)
    limits = {name: value for name, value in wanted.items() if name != "cpu"}
    return {"requests": wanted, "limits": limits} if limits else {"requests": wanted}


def tolerations(cfg: Config) -> list[JSONObject]:
    k = cfg.kubernetes
    out: list[JSONObject] = []
    for text in k.tolerations:
        parsed = parse_toleration(text)
        if isinstance(parsed, str):  # validated already; kept for a config built by hand
            raise ValueError(parsed)
        key, value, effect = parsed
        item: JSONObject = {"key": key, "operator": "Exists" if value is None else "Equal"}
        if value is not None:
            item["value"] = value
        item["effect"] = effect
        out.append(item)
    for taint, seconds in (
        ("node.kubernetes.io/unreachable", k.node_unreachable_seconds),
        ("node.kubernetes.io/not-ready", k.node_not_ready_seconds),
    ):
        item = {"key": taint, "operator": "Exists", "effect": "NoExecute"}
        out.append({**item, "tolerationSeconds": seconds})
    return out


def _volume_source(source: str) -> JSONObject:
    parsed = parse_volume(source)
    if isinstance(parsed, str):
        raise ValueError(parsed)
    kind, args, read_only = parsed
    ro: JSONObject = {"readOnly": True} if read_only else {}
    if kind == "pvc":
        claim: JSONObject = {"claimName": args[0], **ro}
        return {"persistentVolumeClaim": claim}
    if kind == "nfs":
        nfs: JSONObject = {"server": args[0], "path": args[1], **ro}
        return {"nfs": nfs}
    return {"hostPath": {"path": args[0], "type": "Directory"}}


def volumes(cfg: Config, scratch: str | None) -> tuple[list[JSONObject], list[JSONObject]]:
    """(pod volumes, container mounts): /dev/shm, kubernetes.volumes, a scratch emptyDir."""
    k = cfg.kubernetes
    shm = k.shm_size or f"{SHM_PER_RANK_GI * cfg.ranks_per_node}Gi"
    vols: list[JSONObject] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}]
    mounts: list[JSONObject] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for i, (path, source) in enumerate(sorted(k.volumes.items())):
        name = f"volume-{i}"
        vols.append({"name": name, **_volume_source(source)})
        mount: JSONObject = {"name": name, "mountPath": path}
        if source.endswith(":ro"):
            mount["readOnly"] = True
        mounts.append(mount)
    if scratch:
        vols.append({"name": "scratch", "emptyDir": {}})
        mounts.append({"name": "scratch", "mountPath": scratch})
    return vols, mounts


def container(
    cfg: Config,
    *,
    name: str,
    image: str,
    command: Sequence[str],
    env: Sequence[JSONObject],
    mounts: Sequence[JSONObject],
    workdir: str | None,
    port_name: str | None,
) -> JSONObject:
    """``port_name``: the rendezvous port's (None: a service's pod, whose ports are its
    command's business)."""
    out: JSONObject = {"name": name, "image": image, "command": list(command)}
    if workdir:
        out["workingDir"] = workdir
    out["env"] = list(env)
    if port_name:
        out["ports"] = [{"name": port_name, "containerPort": cfg.kubernetes.master_port}]
    out["resources"] = resources(cfg)
    out["volumeMounts"] = list(mounts)
    if cfg.kubernetes.rdma:
        out["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return out


def pod_spec(
    cfg: Config,
    *,
    main: JSONObject,
    volumes_: Sequence[JSONObject],
    same_job: Mapping[str, str],
    restart_policy: str | None,
    run_as: tuple[int, int] | None = None,
) -> JSONObject:
    """The pod spec around ``main``; ``same_job``: the labels every pod of this job has
    (for the one-pod-per-node anti-affinity); ``run_as``: (uid, gid) of the user whose run
    directory (mode 0700, on the shared volume) the pods write."""
    k = cfg.kubernetes
    spec: JSONObject = {}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if run_as is not None:
        spec["securityContext"] = {"runAsUser": run_as[0], "runAsGroup": run_as[1]}
    if k.gang == "coscheduling":
        spec["schedulerName"] = k.scheduler_name
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    if k.priority_class:
        spec["priorityClassName"] = k.priority_class
    spec["terminationGracePeriodSeconds"] = cfg.fault_tolerance.signal_lead
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": dict(same_job)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    spec["tolerations"] = tolerations(cfg)
    spec["containers"] = [main]
    spec["volumes"] = list(volumes_)
    return spec
