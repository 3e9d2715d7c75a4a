"""The pieces a run's Kubernetes objects are made of (pure): the API names and the downward
API fields, node 0's address, a pod's environment and command, the pod template, a training
Job, the JobSet's network and stop rule. ``planning.kubernetes`` makes the objects of a run of
one component from them, ``planning.kubernetes_components`` those of a run of several."""

from __future__ import annotations

from pathlib import PurePosixPath

from ddlaunch.config.schema import Config
from ddlaunch.planning import fabric, kubernetes_pod, pod_env
from ddlaunch.planning.container import CONCLUDE_ON_HOST_VAR
from ddlaunch.planning.kubernetes_pod import JSONObject
from ddlaunch.planning.tracking import tracking_env
from ddlaunch.policy.pod_exit import STOP_EXIT
from ddlaunch.store.layout import CHECKPOINTS_DIR

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
PYTORCHJOB_API = "kubeflow.org/v1"
PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins' Coscheduling
REPLICATED_JOB = "node"  # JobSet pod hostnames: <name>-node-0-<index>
CONTAINER = {"jobset": "trainer", "pytorchjob": "pytorch"}  # the operator wants "pytorch"
# The downward API fields a pod learns its place from.
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESTART_ATTEMPT = "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"
REPLICA_INDEX = "metadata.labels['training.kubeflow.org/replica-index']"


def master_addr(kind: str, name: str, replicated_job: str = REPLICATED_JOB) -> str:
    if kind == "pytorchjob":
        return f"{name}-master-0"  # the training operator's headless service of the Master
    return f"{name}-{replicated_job}-0-0.{name}"  # JobSet: <pod hostname>.<subdomain>


def _env(name: str, value: str) -> JSONObject:
    return {"name": name, "value": value}


def _field(name: str, path: str) -> JSONObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def pod_env_list(
    cfg: Config,
    *,
    kind: str,
    name: str,
    run_id: str,
    run_dir: str,
    pythonpath: str | None,
    leader_job: str = REPLICATED_JOB,
) -> list[JSONObject]:
    """The container's environment: ddlaunch's, the pod's place, fabric, launch.env, tracking."""
    run = PurePosixPath(run_dir)
    out = [
        _env("DDLAUNCH_RUN_DIR", run_dir),
        _env("DDLAUNCH_RUN_ID", run_id),
        _env("DDLAUNCH_WORLD_SIZE", str(cfg.world_size)),
        _env("DDLAUNCH_CHECKPOINT_DIR", cfg.storage.checkpoint_dir or str(run / CHECKPOINTS_DIR)),
    ]
    if cfg.storage.scratch:
        out.append(_env("DDLAUNCH_SCRATCH", cfg.storage.scratch))
    # The leader pod concludes a signal save (train.Session leaves it a record).
    out.append(_env(CONCLUDE_ON_HOST_VAR, "1"))
    out += [
        _env("SUBMITIT_EXECUTOR", pod_env.EXECUTOR),
        _env("SUBMITIT_PREEMPT_SIGNAL", cfg.fault_tolerance.signal),
        _env(pod_env.KIND_VAR, kind),
        _env(pod_env.JOB_VAR, name),
        _env(pod_env.NODES_VAR, str(cfg.nodes.count)),
        _env(pod_env.RANKS_PER_NODE_VAR, str(cfg.ranks_per_node)),
        _env(pod_env.MASTER_ADDR_VAR, master_addr(kind, name, leader_job)),
        _env("DDLAUNCH_MASTER_PORT", str(cfg.kubernetes.master_port)),
        _field(pod_env.NODE_NAME_VAR, "spec.nodeName"),
    ]
    if kind == "jobset":
        out.append(_field(pod_env.NODE_INDEX_VAR, COMPLETION_INDEX))
        out.append(_field(pod_env.RESTART_VAR, RESTART_ATTEMPT))
    else:
        out.append(_field(pod_env.NODE_INDEX_VAR, REPLICA_INDEX))
    if pythonpath:
        out.append(_env("PYTHONPATH", pythonpath))
    env = fabric.fabric_env(cfg)
    out += [_env(k, v) for k, v in env.items() if k not in cfg.launch.env]
    out += [_env(k, v) for k, v in cfg.launch.env.items()]
    out += [_env(k, v) for k, v in tracking_env(cfg, run_id)]
    return out


def entry_command(cfg: Config) -> list[str]:
    """The container's argv: the pod entry; ``launch.setup`` lines (shell code by definition)
    run first through ``bash -c``, the entry's argv passed as arguments, never as text."""
    entry = [cfg.launch.python, "-u", "-m", "ddlaunch.job.pod"]
    if not cfg.launch.setup:
        return entry
    script = "\n".join([*cfg.launch.setup, 'exec "$@"'])
    return ["/bin/bash", "-c", script, "ddlaunch-setup", *entry]


def _labels(cfg: Config, name: str) -> dict[str, str]:
    return {PODGROUP_LABEL: name} if cfg.kubernetes.gang == "coscheduling" else {}


def pod_template(
    cfg: Config,
    kind: str,
    main: JSONObject,
    volumes: list[JSONObject],
    name: str,
    run_as: tuple[int, int] | None,
) -> JSONObject:
    same_job = (
        {"jobset.sigs.k8s.io/jobset-name": name}
        if kind == "jobset"
        else {"training.kubeflow.org/job-name": name}
    )
    spec = kubernetes_pod.pod_spec(
        cfg,
        main=main,
        volumes_=volumes,
        same_job=same_job,
        restart_policy="Never" if kind == "jobset" else None,
        run_as=run_as,
    )
    template: JSONObject = {"spec": spec}
    labels = _labels(cfg, name)
    if labels:
        template = {"metadata": {"labels": labels}, **template}
    return template


def train_job(n: int, template: JSONObject) -> JSONObject:
    """The Job of ``n`` training pods: Indexed, failed by any pod's failure."""
    return {
        "parallelism": n,
        "completions": n,
        "completionMode": "Indexed",
        # Any pod failure ends the Job, and the JobSet restarts every pod (a gang).
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER["jobset"],
                        "operator": "In",
                        "values": [STOP_EXIT],
                    },
                }
            ]
        },
        "template": template,
    }


def network(name: str) -> JSONObject:
    # Pod hostnames resolve behind the headless service before the pods are ready.
    return {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True}


def stop_rule(targets: list[str] | None = None) -> JSONObject:
    """STOP_EXIT fails a training Job through its podFailurePolicy: no restart."""
    rule: JSONObject = {
        "name": "ddlaunchStop",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
    }
    if targets:
        rule["targetReplicatedJobs"] = list(targets)
    return rule
