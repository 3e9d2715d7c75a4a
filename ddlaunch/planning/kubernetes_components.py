"""``components:`` on ``--target kubernetes`` (pure): one JobSet, a replicated job per component.

What a Slurm heterogeneous job does (``planning.components``), in JobSet terms:

* each component is a replicated job (``replicas: 1``) named after it (lower case, ``_`` as
  ``-``), an Indexed Job of ``nodes.count`` pods; its pods are rendered as the one-component
  job the component would be (``component_config``): its GPUs, memory, and a nodeSelector
  ``kubernetes.gpu_type_label: <gpu_type>`` when it names a GPU type;
* the train components' pods run ddlaunch's pod entry as for one component; each pod's node
  index is its completion index plus the train nodes before its component
  (``pod_env.NODE_OFFSET_VAR``), so the ranks are one world numbered component by component,
  with rendezvous at the first train component's pod 0;
* a service's pods run its ``launch.command`` (after ``launch.setup``), with ``launch.env``
  and its own ``launch.env``. A failed service pod is replaced alone by its Job controller
  (``restartPolicy: Never``, ``backoffLimit`` = ``fault_tolerance.max_restarts``, no
  ``podFailurePolicy``): the JobSet sees no failure and the ranks train on. A service that
  fails more often fails its Job; a JobSet cannot leave a failed Job be (its failure policy
  can only fail or restart the JobSet), so the ``ddlaunchService`` rule restarts the whole
  JobSet (counted in ``failurePolicy.maxRestarts`` = ``fault_tolerance.max_requeues``): the
  ranks resume from the latest checkpoint and the service starts afresh. On Slurm such a
  service is left stopped instead;
* the JobSet completes when the train components' Jobs do (``successPolicy`` on them; the
  controller then ends the services' pods), and ``STOP_EXIT`` fails it through a train Job's
  ``podFailurePolicy`` as for one component;
* every pod is told every component's pods: ``DDLAUNCH_COMPONENT_<NAME>_NODES`` (their stable
  DNS names behind the JobSet's headless service, ``<jobset>-<rjob>-0-<i>.<jobset>``,
  comma-separated) and ``..._ADDR`` (the first), and ``DDLAUNCH_TRAIN_COMPONENTS``.

What has no Kubernetes meaning is refused, each with its reason (``issues``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ddlaunch.config.components import (
    SERVICE,
    TRAIN,
    TRAIN_COMPONENTS_VAR,
    ComponentSpec,
    env_prefix,
    gpus_of,
    ranks_per_node,
)
from ddlaunch.config.errors import ConfigIssue
from ddlaunch.config.kubernetes_rules import LABEL_VALUE
from ddlaunch.config.schema import Config
from ddlaunch.planning import kubernetes_jobs, kubernetes_pod, pod_env
from ddlaunch.planning.kubernetes_pod import JSONObject

HOSTNAME_MAX = 63  # a pod's hostname is a DNS label
# The Job controller names a pod <hostname>-<5 characters>; the JobSet webhook checks that
# the longest such name is a DNS label too.
POD_SUFFIX = 6
NAME_MIN = 16  # the shortest object name: a prefix, "-" and object_name's 10-digit digest
SERVICE_RULE = "ddlaunchService"


@dataclass(frozen=True)
class ComponentJob:
    """A component as a replicated job: ``count`` pods ``<jobset>-<rjob>-0-<i>``;
    ``offset``: the nodes of the train components before it (a train component's)."""

    name: str
    rjob: str
    role: str
    count: int
    offset: int

    def hostnames(self, jobset: str) -> list[str]:
        return [f"{jobset}-{self.rjob}-0-{i}.{jobset}" for i in range(self.count)]

    @property
    def suffix_length(self) -> int:
        """What a pod's name adds to the JobSet's name, at the longest."""
        return len(f"-{self.rjob}-0-{self.count - 1}") + POD_SUFFIX


def replicated_job_name(component: str) -> str:
    """The replicated job of a component: a DNS label (names differ in more than case)."""
    return component.lower().replace("_", "-")


def component_jobs(cfg: Config) -> list[ComponentJob]:
    out, offset = [], 0
    for comp in cfg.components:
        train = comp.role == TRAIN
        rjob = replicated_job_name(comp.name)
        out.append(
            ComponentJob(comp.name, rjob, comp.role, comp.nodes.count, offset if train else 0)
        )
        offset += comp.nodes.count if train else 0
    return out


def name_limit(cfg: Config, default: int) -> int:
    """The longest JobSet name whose pods' names all fit (at most ``default``)."""
    room = [HOSTNAME_MAX - job.suffix_length for job in component_jobs(cfg)]
    return max(NAME_MIN, min([default, *room]))


def issues(cfg: Config) -> list[ConfigIssue]:
    """What ``components:`` cannot be on Kubernetes, each with its reason."""
    out = []
    if cfg.kubernetes.kind != "jobset":
        out.append(
            ConfigIssue(
                "kubernetes.kind",
                "components render as the replicated jobs of one JobSet; a PyTorchJob has "
                "one pod shape for its workers: use kind: jobset",
            )
        )
    label = cfg.kubernetes.gpu_type_label
    for i, (comp, job) in enumerate(zip(cfg.components, component_jobs(cfg), strict=True)):
        at = f"components.{i}"
        if job.rjob.endswith("-"):
            out.append(
                ConfigIssue(
                    f"{at}.name",
                    f"{comp.name!r} cannot name the component's JobSet replicated job "
                    "(a Kubernetes name ends with a letter or digit): drop the trailing _",
                )
            )
        elif HOSTNAME_MAX - job.suffix_length < NAME_MIN:
            longest = len(comp.name) - (NAME_MIN - HOSTNAME_MAX + job.suffix_length)
            out.append(
                ConfigIssue(
                    f"{at}.name",
                    f"{comp.name!r} is too long for its pods' names (<jobset>-{job.rjob}-0-"
                    f"<index>, at most {HOSTNAME_MAX} characters): at most {longest} "
                    "characters on Kubernetes",
                )
            )
        out += _node_issues(at, comp, label)
    return out


def _node_issues(at: str, comp: ComponentSpec, label: str) -> list[ConfigIssue]:
    nodes = comp.nodes
    out = []
    placed = (
        f"on Kubernetes a component's pods are placed by nodes.gpu_type (nodeSelector "
        f"{label}) and kubernetes.node_selector"
    )
    if nodes.partition:
        out.append(ConfigIssue(f"{at}.nodes.partition", f"a Slurm partition; {placed}"))
    if nodes.constraint:
        out.append(ConfigIssue(f"{at}.nodes.constraint", f"Slurm node features; {placed}"))
    if nodes.gpu_type and not (len(nodes.gpu_type) <= 63 and LABEL_VALUE.match(nodes.gpu_type)):
        out.append(
            ConfigIssue(
                f"{at}.nodes.gpu_type",
                f"{nodes.gpu_type!r} is not a Kubernetes label value (the pods' nodeSelector "
                f"{label}: <gpu_type>)",
            )
        )
    if comp.role == SERVICE and (nodes.tasks_per_node or 1) > 1:
        out.append(
            ConfigIssue(
                f"{at}.nodes.tasks_per_node",
                f"a service's pod runs launch.command once; {nodes.tasks_per_node} copies per "
                "node are srun's (start them from the command on Kubernetes)",
            )
        )
    return out


def component_config(cfg: Config, comp: ComponentSpec) -> Config:
    """The config as if ``comp`` were the whole job: what its pods are rendered from (GPUs,
    memory, CPUs, /dev/shm, nodeSelector). A service asks for no CPUs and no RDMA devices,
    and for GPUs only when it says so (as on Slurm)."""
    nodes, k = cfg.nodes, cfg.kubernetes
    selector = dict(k.node_selector)
    if comp.nodes.gpu_type:
        selector[k.gpu_type_label] = comp.nodes.gpu_type
    mem = comp.nodes.mem or nodes.mem
    if comp.role == TRAIN:
        gpus = gpus_of(comp, nodes.gpus_per_node)
        tasks = None if gpus else (comp.nodes.tasks_per_node or nodes.tasks_per_node)
        shape = dataclasses.replace(
            nodes, count=comp.nodes.count, gpus_per_node=gpus, tasks_per_node=tasks, mem=mem
        )
        return dataclasses.replace(
            cfg, nodes=shape, kubernetes=dataclasses.replace(k, node_selector=selector)
        )
    gpus = comp.nodes.gpus_per_node or 0
    shape = dataclasses.replace(
        nodes,
        count=comp.nodes.count,
        gpus_per_node=gpus,
        tasks_per_node=None if gpus else 1,
        mem=mem,
        cpus_per_task=None,
        mem_per_cpu=None,
        mem_per_gpu=nodes.mem_per_gpu if gpus else None,
    )
    return dataclasses.replace(
        cfg,
        nodes=shape,
        cluster=dataclasses.replace(cfg.cluster, cpu_binding=False),
        kubernetes=dataclasses.replace(k, node_selector=selector, rdma={}),
    )


def shared_env(cfg: Config, jobset: str) -> list[tuple[str, str]]:
    """What every pod is told: the train components in rank order, every component's pods."""
    default = cfg.nodes.gpus_per_node
    train = [c for c in cfg.components if c.role == TRAIN]
    ranks = ",".join(f"{c.name}:{c.nodes.count * ranks_per_node(c, default)}" for c in train)
    out = [(TRAIN_COMPONENTS_VAR, ranks)]
    for job in component_jobs(cfg):
        hosts = job.hostnames(jobset)
        prefix = env_prefix(job.name)
        out += [(f"{prefix}_NODES", ",".join(hosts)), (f"{prefix}_ADDR", hosts[0])]
    return out


def service_command(cfg: Config, comp: ComponentSpec) -> list[str]:
    """A service's argv: its ``launch.command``, after ``launch.setup`` as the ranks' is."""
    command = list(comp.launch.command)
    if not cfg.launch.setup:
        return command
    script = "\n".join([*cfg.launch.setup, 'exec "$@"'])
    return ["/bin/bash", "-c", script, "ddlaunch-setup", *command]


@dataclass(frozen=True)
class PodBase:
    """What every pod of the run shares, decided by ``planning.kubernetes``."""

    name: str  # the JobSet's
    run_id: str
    run_dir: str
    image: str
    pythonpath: str | None
    workdir: str | None
    scratch: str | None  # an emptyDir at storage.scratch, when no volume holds it
    run_as: tuple[int, int] | None


def _env(pairs: list[tuple[str, str]]) -> list[JSONObject]:
    return [{"name": k, "value": v} for k, v in pairs]


def _train_job(cfg: Config, comp: ComponentSpec, job: ComponentJob, base: PodBase) -> JSONObject:
    view = component_config(cfg, comp)
    # The world's shape (nodes, ranks per node, world size) is the whole config's.
    env = kubernetes_jobs.pod_env_list(
        cfg,
        kind="jobset",
        name=base.name,
        run_id=base.run_id,
        run_dir=base.run_dir,
        pythonpath=base.pythonpath,
        leader_job=leader_job(cfg),
    )
    env += _env(
        [
            (pod_env.NODE_OFFSET_VAR, str(job.offset)),
            (pod_env.COMPONENT_VAR, comp.name),
            *shared_env(cfg, base.name),
        ]
    )
    volumes, mounts = kubernetes_pod.volumes(view, base.scratch)
    main = kubernetes_pod.container(
        view,
        name=kubernetes_jobs.CONTAINER["jobset"],
        image=base.image,
        command=kubernetes_jobs.entry_command(cfg),
        env=env,
        mounts=mounts,
        workdir=base.workdir,
        port_name="rendezvous",
    )
    template = kubernetes_jobs.pod_template(view, "jobset", main, volumes, base.name, base.run_as)
    return kubernetes_jobs.train_job(comp.nodes.count, template)


def _service_job(cfg: Config, comp: ComponentSpec, job: ComponentJob, base: PodBase) -> JSONObject:
    view = component_config(cfg, comp)
    pairs = [("DDLAUNCH_RUN_DIR", base.run_dir), ("DDLAUNCH_RUN_ID", base.run_id)]
    pairs += shared_env(cfg, base.name)
    if base.pythonpath:
        pairs.append(("PYTHONPATH", base.pythonpath))
    pairs += [(k, v) for k, v in cfg.launch.env.items() if k not in comp.launch.env]
    pairs += list(comp.launch.env.items())
    volumes, mounts = kubernetes_pod.volumes(view, base.scratch)
    main = kubernetes_pod.container(
        view,
        name=job.rjob,
        image=base.image,
        command=service_command(cfg, comp),
        env=_env(pairs),
        mounts=mounts,
        workdir=base.workdir,
        port_name=None,
    )
    template = kubernetes_jobs.pod_template(view, "jobset", main, volumes, base.name, base.run_as)
    n = comp.nodes.count
    return {
        "parallelism": n,
        "completions": n,
        "completionMode": "Indexed",  # stable hostnames: <jobset>-<rjob>-0-<index>
        # A failed pod is replaced by the Job controller alone, up to max_restarts times.
        "backoffLimit": cfg.fault_tolerance.max_restarts,
        "template": template,
    }


def jobset(cfg: Config, meta: JSONObject, base: PodBase) -> JSONObject:
    jobs = component_jobs(cfg)
    train = [j.rjob for j in jobs if j.role == TRAIN]
    services = [j.rjob for j in jobs if j.role == SERVICE]
    replicated: list[JSONObject] = []
    for comp, job in zip(cfg.components, jobs, strict=True):
        make = _train_job if job.role == TRAIN else _service_job
        job_spec = make(cfg, comp, job, base)
        replicated.append({"name": job.rjob, "replicas": 1, "template": {"spec": job_spec}})
    rules: list[JSONObject] = [kubernetes_jobs.stop_rule(train)]
    if services:
        # Reached only when a service failed more than max_restarts times.
        rules.append(
            {"name": SERVICE_RULE, "action": "RestartJobSet", "targetReplicatedJobs": services}
        )
    spec: JSONObject = {
        "network": kubernetes_jobs.network(base.name),
        "successPolicy": {"operator": "All", "targetReplicatedJobs": train},
        "failurePolicy": {"maxRestarts": cfg.fault_tolerance.max_requeues, "rules": rules},
        "replicatedJobs": replicated,
    }
    return {
        "apiVersion": kubernetes_jobs.JOBSET_API,
        "kind": "JobSet",
        "metadata": meta,
        "spec": spec,
    }


def leader_job(cfg: Config) -> str:
    """The replicated job of node 0: the first train component's."""
    return next(j.rjob for j in component_jobs(cfg) if j.role == TRAIN)


def pod_count(cfg: Config) -> int:
    """Every pod of the JobSet (a PodGroup's minMember)."""
    return sum(c.nodes.count for c in cfg.components)
