"""Rendering for the Kubernetes tests: the overrides that make a shipped example renderable
for ``--target kubernetes`` (an image, a volume holding the run root), and the environment
a pod of the rendered manifest would see."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from ddlaunch.app.kubernetes import PreparedObjects, prepare_objects

IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
ROOT = "/shared/runs"
GANGS = {"none": [], "kueue": ["kubernetes.queue=team-a"], "coscheduling": []}


def k8s_overrides(root: str = ROOT, image: str | None = IMAGE) -> list[str]:
    volume = "/" + root.strip("/").split("/")[0]  # the run root's top directory
    out = [f"kubernetes.volumes={json.dumps({volume: 'pvc:ddlaunch-shared'})}"]
    if image:
        out.append(f"container.image={image}")
    return out


def render(
    name: str,
    overrides: Sequence[str] = (),
    *,
    kind: str = "jobset",
    gang: str = "none",
    root: str = ROOT,
    image: str | None = IMAGE,
) -> PreparedObjects:
    sets = [
        *k8s_overrides(root, image),
        f"kubernetes.kind={kind}",
        f"kubernetes.gang={gang}",
        *GANGS[gang],
        *overrides,
    ]
    return prepare_objects(
        name, sets, run_id="golden", run_root=root, snapshot="skip", run_as=(1000, 1000)
    )


def documents(prepared: PreparedObjects) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(prepared.manifest))


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] in ("JobSet", "PyTorchJob"))


def pod_templates(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod template of the workload (JobSet: one; PyTorchJob: Master, Worker)."""
    w = workload(docs)
    if w["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in w["spec"]["replicatedJobs"]]
    return [spec["template"] for spec in w["spec"]["pytorchReplicaSpecs"].values()]


def container_of(template: dict[str, Any]) -> dict[str, Any]:
    (main,) = template["spec"]["containers"]
    return main


def pod_environment(
    template: dict[str, Any], *, index: int, restart: int = 0, node: str = "node-a"
) -> dict[str, str]:
    """The container's environment as the kubelet would set it for the pod of ``index``:
    plain values, and the downward-API fields the manifest asks for."""
    fields = {
        "spec.nodeName": node,
        "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
        "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']": str(restart),
    }
    env: dict[str, str] = {}
    items = container_of(template)["env"]
    offset = int(next((e["value"] for e in items if e["name"] == "DDLAUNCH_K8S_NODE_OFFSET"), 0))
    for item in items:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            if path == "metadata.labels['training.kubeflow.org/replica-index']":
                env[item["name"]] = str(index - offset)  # the operator's replica index
            else:
                env[item["name"]] = fields[path]
    return env
