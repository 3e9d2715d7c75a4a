"""Config -> the Kubernetes objects of a run (pure): ``render/submit --target kubernetes``.

The same contract as the sbatch script: one pod per node (a JobSet's Indexed Job with
``parallelism = completions = nodes.count``, or a PyTorchJob's Master + Workers), and in each
pod ddlaunch's pod entry (``python -m ddlaunch.job.pod``) starting one rank per GPU through the
same rank runner as srun's tasks (``ddlaunch.worker.task`` on the run's submitit pickle). The
torchrun variables come from the pod's node index (the Job completion index, through the
downward API) and node 0's stable DNS name behind the headless service (JobSet:
``<name>-node-0-0.<name>``; PyTorchJob: the operator's ``<name>-master-0``).

Recovery is ddlaunch's, mapped onto Kubernetes' machinery (``policy.pod_exit``): the leader pod
concludes each attempt with ``conclude.conclude`` (the same policy as on Slurm) and every pod
exits with the decision's code. A JobSet restarts on any failure, at most
``failurePolicy.maxRestarts`` = ``fault_tolerance.max_requeues`` times; ``STOP_EXIT`` fails
the Job through its ``podFailurePolicy`` and the JobSet through a ``FailJobSet`` rule. A
PyTorchJob uses ``restartPolicy: ExitCode``.

Everything is plain data serialised with ``yaml`` (safe dumper): every config string is one
YAML scalar, and the container runs an argv, not a shell line (``launch.setup``, shell code on
purpose, is the one exception, as in the batch script, run by ``bash -c`` before the entry).

The parts of the Kubernetes backend, by where they run (the import rules place them; this is
their index): ``config.kubernetes`` and ``config.kubernetes_rules`` (the section and its
rules), this module with ``planning.kubernetes_jobs`` (their pieces), ``planning.kubernetes_pod``
and ``planning.pod_env`` (the objects;
``planning.kubernetes_components``: a replicated job per component of ``components:``),
``app.kubernetes`` (render and submit), ``job.pod`` (each pod's entry), ``policy.pod_exit``
and ``store.pods`` (the leader's conclusion as every pod's exit code), ``worker.distenv``
(the ranks' torchrun variables).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from ddlaunch.config.container_rules import image_problem
from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.schema import Config
from ddlaunch.planning import kubernetes_pod, pod_env
from ddlaunch.planning.kubernetes_jobs import (
    CONTAINER,
    JOBSET_API,
    PODGROUP_API,
    PYTORCHJOB_API,
    QUEUE_LABEL,
    REPLICATED_JOB,
    _env,
    entry_command,
    master_addr,
    network,
    pod_env_list,
    pod_template,
    stop_rule,
    train_job,
)
from ddlaunch.planning.kubernetes_pod import JSONObject
from ddlaunch.planning.plan import CodePaths
from ddlaunch.store.layout import CHECKPOINTS_DIR, MANIFEST_FILE

# A pod's hostname is <name>-node-0-<index> (JobSet) or <name>-worker-<index> (PyTorchJob),
# at most 63 characters; Service names must start with a letter.
NAME_MAX = 40
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
FILE_IMAGE = (".sif", ".simg", ".img", ".sqsh", ".squashfs", ".tar")


@dataclass(frozen=True)
class KubernetesPlan:
    run_id: str
    run_dir: str
    name: str  # the JobSet's or PyTorchJob's name: the attempts' job id
    kind: str
    namespace: str | None
    documents: tuple[JSONObject, ...]
    # The replicated job of node 0 (``components:``: the first train component's).
    leader_job: str = REPLICATED_JOB

    @property
    def manifest_path(self) -> str:
        return str(PurePosixPath(self.run_dir) / MANIFEST_FILE)

    @property
    def master_addr(self) -> str:
        return master_addr(self.kind, self.name, self.leader_job)


def object_name(run_id: str, limit: int = NAME_MAX) -> str:
    """A DNS-1035 label for the run's objects, short enough for the pods' hostnames
    (``limit``: shorter where a component's replicated job has a long name)."""
    name = _NOT_NAME.sub("-", run_id.lower()).strip("-") or "run"
    if not name[0].isalpha():
        name = f"ddl-{name}"
    if len(name) > limit:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
        name = f"{name[: limit - 11].rstrip('-')}-{digest}"
    return name


def _reference(image: str) -> str:
    # docker://ref (apptainer, podman) and enroot's registry#path (pyxis) name the same image.
    return image.removeprefix("docker://").replace("#", "/", 1)


def _image_problem(cfg: Config) -> str | None:
    """Why ``container.image`` cannot be the pods' image, or None."""
    image = cfg.container.image
    if not image:
        return (
            "--target kubernetes runs the ranks in an image: set container.image "
            "(e.g. nvcr.io/nvidia/pytorch:24.05-py3, with ddlaunch installed or on a "
            "kubernetes.volumes mount)"
        )
    if image.startswith(("/", ".", "~")) or image.endswith(FILE_IMAGE):
        return f"{image!r} is an image file; Kubernetes pulls a registry reference"
    return image_problem("podman", _reference(image))  # podman takes plain references


def _covering(cfg: Config, path: str) -> tuple[str, bool] | None:
    """The kubernetes.volumes mount path that holds ``path``, and whether it is read-only."""
    best = None
    for mount in cfg.kubernetes.volumes:
        if PurePosixPath(path).is_relative_to(mount) and (best is None or len(mount) > len(best)):
            best = mount
    return (best, cfg.kubernetes.volumes[best].endswith(":ro")) if best else None


def _check_storage(cfg: Config, run_dir: str, checkpoints: str) -> list[ConfigIssue]:
    issues = []
    # The run root, not the run directory: render invents a fresh id every time, and a
    # mount that covers the root covers every run under it.
    paths = [("storage.run_root", str(PurePosixPath(run_dir).parent))]
    if cfg.storage.checkpoint_dir:  # else inside the run directory: its problem is the root's
        paths.append(("storage.checkpoint_dir", checkpoints))
    for key, path in paths:
        cover = _covering(cfg, path)
        if cover is None or cover[1]:
            mounts = ", ".join(sorted(cfg.kubernetes.volumes)) or "none"
            why = (
                "is on no writable kubernetes.volumes mount"
                if cover is None
                else (f"is on the read-only volume {cover[0]}")
            )
            issues.append(
                ConfigIssue(
                    "kubernetes.volumes",
                    f"{path} ({key}) {why} (mounts: {mounts}): the pods write the attempts, "
                    "logs and checkpoints there, and ddlaunch reads them back from here",
                )
            )
    return issues


def _code(cfg: Config, code: CodePaths) -> tuple[str | None, str | None]:
    """(PYTHONPATH, workingDir): the snapshot and this ddlaunch when a volume holds them."""
    paths = [p for p in (code.snapshot, code.ddlaunch_root) if p and _covering(cfg, p)]
    pythonpath = ":".join(dict.fromkeys(paths)) or None
    workdir = cfg.container.workdir
    ranks_dir = code.workdir or cfg.launch.workdir
    if ranks_dir and _covering(cfg, ranks_dir):
        workdir = ranks_dir
    return pythonpath, workdir


def _metadata(cfg: Config, name: str, run_id: str) -> JSONObject:
    meta: JSONObject = {"name": name}
    if cfg.kubernetes.namespace:
        meta["namespace"] = cfg.kubernetes.namespace
    labels = {"app.kubernetes.io/managed-by": "ddlaunch"}
    if cfg.kubernetes.queue:
        labels[QUEUE_LABEL] = cfg.kubernetes.queue
    meta["labels"] = labels
    meta["annotations"] = {"ddlaunch/run-id": run_id}
    return meta


def _jobset(cfg: Config, meta: JSONObject, template: JSONObject) -> JSONObject:
    n, name = cfg.nodes.count, str(meta["name"])
    spec: JSONObject = {
        "network": network(name),
        "failurePolicy": {"maxRestarts": cfg.fault_tolerance.max_requeues, "rules": [stop_rule()]},
        "replicatedJobs": [
            {"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": train_job(n, template)}}
        ],
    }
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": meta, "spec": spec}


def _pytorchjob(
    cfg: Config, meta: JSONObject, master: JSONObject, worker: JSONObject
) -> JSONObject:
    n = cfg.nodes.count
    replicas: JSONObject = {
        "Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": master}
    }
    if n > 1:
        replicas["Worker"] = {"replicas": n - 1, "restartPolicy": "ExitCode", "template": worker}
    spec: JSONObject = {
        "pytorchReplicaSpecs": replicas,
        "runPolicy": {"backoffLimit": cfg.fault_tolerance.max_requeues, "cleanPodPolicy": "All"},
    }
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": meta, "spec": spec}


def podgroup(cfg: Config, name: str, pods: int) -> JSONObject:
    spec: JSONObject = {"minMember": pods}
    if cfg.kubernetes.gang_timeout:
        spec["scheduleTimeoutSeconds"] = cfg.kubernetes.gang_timeout
    meta: JSONObject = {"name": name}
    if cfg.kubernetes.namespace:
        meta["namespace"] = cfg.kubernetes.namespace
    return {"apiVersion": PODGROUP_API, "kind": "PodGroup", "metadata": meta, "spec": spec}


def _slurm_only(cfg: Config) -> list[ConfigIssue]:
    """Settings that need a Slurm allocation to act in: refused rather than ignored."""
    why = "hot spares and elastic shrink act inside a Slurm allocation; not on Kubernetes"
    issues = []
    if cfg.fault_tolerance.spare_nodes:
        issues.append(ConfigIssue("fault_tolerance.spare_nodes", why))
    if cfg.nodes.min is not None:
        issues.append(ConfigIssue("nodes.min", why))
    if cfg.fault_tolerance.mode == "replica_groups":
        issues.append(
            ConfigIssue(
                "fault_tolerance.mode",
                "replica_groups is not built for --target kubernetes (each group would need "
                "its own independently restarting replicated job plus a lighthouse service); "
                "use fault_tolerance.mode: job there, or submit to Slurm",
            )
        )
    return issues


def make_kubernetes_plan(
    cfg: Config,
    *,
    run_id: str,
    run_dir: str,
    code: CodePaths | None = None,
    run_as: tuple[int, int] | None = None,
) -> KubernetesPlan:
    """The objects of one run: [PodGroup,] JobSet or PyTorchJob. ``run_as``: the (uid, gid)
    the pods run as, the owner of the run directory (decided at the edge)."""
    code = code or CodePaths()
    limit, component_issues = _component_checks(cfg)
    kind, name = cfg.kubernetes.kind, object_name(run_id, limit)
    checkpoints = cfg.storage.checkpoint_dir or str(PurePosixPath(run_dir) / CHECKPOINTS_DIR)
    # Every problem of the target at once: the user fixes them in one pass.
    problem = _image_problem(cfg)
    issues = [ConfigIssue("container.image", problem)] if problem else []
    issues += _check_storage(cfg, run_dir, checkpoints) + _slurm_only(cfg)
    issues += component_issues
    if issues:
        raise ConfigError(issues)
    image = _reference(cfg.container.image or "")
    pythonpath, workdir = _code(cfg, code)
    scratch = cfg.storage.scratch
    own_scratch = scratch if scratch and not _covering(cfg, scratch) else None
    if cfg.components:
        objects, leader = _components_documents(
            cfg, name, run_id, run_dir, image, pythonpath, workdir, own_scratch, run_as
        )
        return KubernetesPlan(
            run_id=run_id,
            run_dir=run_dir,
            name=name,
            kind=kind,
            namespace=cfg.kubernetes.namespace,
            documents=tuple(objects),
            leader_job=leader,
        )
    volumes, mounts = kubernetes_pod.volumes(cfg, own_scratch)
    env = pod_env_list(
        cfg, kind=kind, name=name, run_id=run_id, run_dir=run_dir, pythonpath=pythonpath
    )

    def main(extra: list[JSONObject]) -> JSONObject:
        return kubernetes_pod.container(
            cfg,
            name=CONTAINER[kind],
            image=image,
            command=entry_command(cfg),
            env=[*env, *extra],
            mounts=mounts,
            workdir=workdir,
            port_name="pytorchjob-port" if kind == "pytorchjob" else "rendezvous",
        )

    meta = _metadata(cfg, name, run_id)
    docs: list[JSONObject] = []
    if cfg.kubernetes.gang == "coscheduling":
        docs.append(podgroup(cfg, name, cfg.nodes.count))
    if kind == "jobset":
        docs.append(_jobset(cfg, meta, pod_template(cfg, kind, main([]), volumes, name, run_as)))
    else:
        offsets = (_env(pod_env.NODE_OFFSET_VAR, "0"), _env(pod_env.NODE_OFFSET_VAR, "1"))
        master, worker = (
            pod_template(cfg, kind, main([offset]), volumes, name, run_as) for offset in offsets
        )
        docs.append(_pytorchjob(cfg, meta, master, worker))
    return KubernetesPlan(
        run_id=run_id,
        run_dir=run_dir,
        name=name,
        kind=kind,
        namespace=cfg.kubernetes.namespace,
        documents=tuple(docs),
    )


def _component_checks(cfg: Config) -> tuple[int, list[ConfigIssue]]:
    """The longest object name, and the target's refusals, of a run with ``components:``
    (``planning.kubernetes_components``, imported only for one)."""
    if not cfg.components:
        return NAME_MAX, []
    from ddlaunch.planning import kubernetes_components as parts

    return parts.name_limit(cfg, NAME_MAX), parts.issues(cfg)


def _components_documents(
    cfg: Config,
    name: str,
    run_id: str,
    run_dir: str,
    image: str,
    pythonpath: str | None,
    workdir: str | None,
    scratch: str | None,
    run_as: tuple[int, int] | None,
) -> tuple[list[JSONObject], str]:
    """[PodGroup,] the JobSet of a run with ``components:``, and node 0's replicated job."""
    from ddlaunch.planning import kubernetes_components as parts

    base = parts.PodBase(name, run_id, run_dir, image, pythonpath, workdir, scratch, run_as)
    docs: list[JSONObject] = []
    if cfg.kubernetes.gang == "coscheduling":
        docs.append(podgroup(cfg, name, parts.pod_count(cfg)))
    docs.append(parts.jobset(cfg, _metadata(cfg, name, run_id), base))
    return docs, parts.leader_job(cfg)


_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def manifest_text(plan: KubernetesPlan, version: str, sources: tuple[str, ...] = ()) -> str:
    """The objects as one multi-document YAML file, with a comment saying where it came from."""
    body = yaml.dump_all(
        list(plan.documents),
        Dumper=_DUMPER,
        sort_keys=False,
        default_flow_style=False,
        explicit_start=True,
        width=100,
        allow_unicode=True,
    )
    header = [f"# ddlaunch {version}: run {plan.run_id} ({plan.kind})"]
    if sources:
        header.append(f"# Config: {', '.join(sources)}")
    # Comment lines end at a line break: none may come from a config string.
    lines = [re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", "?", line) for line in header]
    return "\n".join(lines) + "\n" + body
