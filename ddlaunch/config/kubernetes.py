"""The ``kubernetes:`` section: how ``--target kubernetes`` renders a run (a gang-scheduled
JobSet or PyTorchJob). Site facts (RDMA resource names, the GPU resource) usually come from a
cluster preset. Cross-field rules are in ``config.kubernetes_rules``."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.config.fields import opt


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec:
    kind: str = opt(
        "jobset",
        "What --target kubernetes renders: jobset (JobSet, jobset.x-k8s.io/v1alpha2) or "
        "pytorchjob (Kubeflow training operator, kubeflow.org/v1).",
        choices=("jobset", "pytorchjob"),
    )
    namespace: str | None = opt(
        None, "Namespace of the objects; unset: kubectl's current one.", pattern="dns_label"
    )
    gang: str = opt(
        "none",
        "All-or-nothing scheduling: kueue (admission through kubernetes.queue), coscheduling "
        "(scheduler-plugins PodGroup with minMember = nodes.count) or none.",
        choices=("kueue", "coscheduling", "none"),
    )
    queue: str | None = opt(
        None,
        "Kueue LocalQueue (label kueue.x-k8s.io/queue-name); needed with gang: kueue.",
        pattern="dns_label",
    )
    scheduler_name: str = opt(
        "scheduler-plugins-scheduler",
        "schedulerName of the pods with gang: coscheduling (the scheduler-plugins scheduler "
        "running the Coscheduling plugin; its Helm chart's default name).",
        pattern="dns_subdomain",
    )
    gang_timeout: int | None = opt(
        None,
        "PodGroup scheduleTimeoutSeconds (gang: coscheduling); unset: the plugin's default.",
        range=(1, 86400),
    )
    service_account: str | None = opt(
        None, "serviceAccountName of the pods.", pattern="dns_subdomain"
    )
    priority_class: str | None = opt(
        None, "priorityClassName of the pods (Kueue also orders by it).", pattern="dns_subdomain"
    )
    node_selector: dict[str, str] = opt({}, "nodeSelector of the pods, label: value.")
    tolerations: tuple[str, ...] = opt(
        [],
        "More tolerations, in kubectl taint syntax: key[=value]:Effect, e.g. "
        "nvidia.com/gpu:NoSchedule (no value: operator Exists).",
    )
    node_unreachable_seconds: int = opt(
        30,
        "tolerationSeconds for node.kubernetes.io/unreachable: how long a pod stays bound to "
        "a node that stopped answering (Kubernetes' default is 300).",
        range=(0, 86400),
    )
    node_not_ready_seconds: int = opt(
        30,
        "tolerationSeconds for node.kubernetes.io/not-ready (Kubernetes' default is 300).",
        range=(0, 86400),
    )
    volumes: dict[str, str] = opt(
        {},
        "Volumes by mount path: pvc:CLAIM, nfs:SERVER:/export or host:/path, each optionally "
        "ending in :ro. The run root (and checkpoint directory) must lie on one, at the same "
        "path as on the machine running ddlaunch.",
    )
    resources: dict[str, str] = opt(
        {},
        "Resource requests that override or add to the computed ones (cpu, memory, "
        "ephemeral-storage, any extended resource), name: quantity.",
    )
    gpu_resource: str = opt(
        "nvidia.com/gpu",
        "The extended resource that counts GPUs (amd.com/gpu on AMD nodes); "
        "nodes.gpus_per_node of it per pod.",
    )
    gpu_type_label: str = opt(
        "nvidia.com/gpu.product",
        "The node label a component's nodes.gpu_type selects (components: a nodeSelector "
        "<label>: <gpu_type> on that component's pods); the default is GPU feature "
        "discovery's, whose values read like NVIDIA-H100-80GB-HBM3.",
    )
    rdma: dict[str, str] = opt(
        {},
        "RDMA device resources per pod, e.g. rdma/rdma_shared_device_a: 1 or "
        "vpc.amazonaws.com/efa: 32 (site-specific names: set in the cluster preset).",
    )
    shm_size: str | None = opt(
        None,
        "Size of the memory-backed /dev/shm; default 4Gi per rank.",
        pattern="quantity",
    )
    master_port: int = opt(
        29500,
        "Rendezvous port on node 0 (each pod has its own network namespace).",
        range=(1024, 65535),
    )
