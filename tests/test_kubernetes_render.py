"""``render --target kubernetes``: golden manifests per kind x gang, the Slurm contract in a
pod (one pod per node, one rank per GPU, the torchrun variables from the completion index and
node 0's DNS name), recovery mapped onto Kubernetes, and the errors for what cannot render.

Regenerate the goldens after an intended change with:
  DDLAUNCH_UPDATE_GOLDEN=1 pytest tests/test_kubernetes_render.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.kube import (
    GANGS,
    container_of,
    documents,
    pod_environment,
    pod_templates,
    render,
    workload,
)

from ddlaunch.config import ConfigError
from ddlaunch.policy.pod_exit import RETRY_EXIT, STOP_EXIT
from ddlaunch.worker.distenv import from_environ, torchrun_env

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "kubernetes"
UPDATE = os.environ.get("DDLAUNCH_UPDATE_GOLDEN") == "1"
CASES = [(kind, gang) for kind in ("jobset", "pytorchjob") for gang in GANGS]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # config sources are shown relative to the working directory


@pytest.mark.parametrize(("kind", "gang"), CASES, ids=[f"{k}-{g}" for k, g in CASES])
def test_golden_manifest(kind: str, gang: str) -> None:
    manifest = render("examples/mlp", kind=kind, gang=gang).manifest
    golden = GOLDEN / f"{kind}-{gang}.yaml"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(manifest)
    assert golden.exists(), f"no golden {golden}; DDLAUNCH_UPDATE_GOLDEN=1 pytest {__file__}"
    assert manifest == golden.read_text(), (
        f"{kind}/{gang} renders differently from {golden.relative_to(REPO)}; if intended, "
        "regenerate with DDLAUNCH_UPDATE_GOLDEN=1 pytest tests/test_kubernetes_render.py"
    )


def test_no_stale_goldens() -> None:
    assert {p.name for p in GOLDEN.glob("*.yaml")} == {f"{k}-{g}.yaml" for k, g in CASES}


def _dgx(tmp_path: Path, body: str = "") -> str:
    config = tmp_path / "dgx.yaml"
    config.write_text(
        "defaults: [clusters/dgx-h100]\n"
        "nodes: {count: 4, gpus_per_node: 8, mem: 1024G}\n"
        "launch: {entrypoint: ddlaunch.examples.mlp:main}\n" + body
    )
    return str(config)


def test_one_pod_per_node_one_rank_per_gpu_jobset(tmp_path: Path) -> None:
    docs = documents(render(_dgx(tmp_path)))
    (jobset,) = docs
    (rjob,) = jobset["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (rjob["replicas"], job["parallelism"], job["completions"]) == (1, 4, 4)
    assert job["completionMode"] == "Indexed"
    (template,) = pod_templates(docs)
    anti = template["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "golden"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    main = container_of(template)
    # 8 GPUs, the preset's RDMA device, NUMA-aware CPUs (2 x 56 cores / 8 ranks x 8), 1024G.
    assert main["resources"] == {
        "requests": {
            "cpu": "112",
            "memory": "1024Gi",
            "nvidia.com/gpu": "8",
            "rdma/rdma_shared_device_a": "1",
        },
        "limits": {"memory": "1024Gi", "nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"},
    }
    assert main["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NCCL_IB_HCA"].startswith("=mlx5_0,")  # the fabric profile, as on Slurm
    assert env["NCCL_IB_TIMEOUT"] == "22"
    assert env["DDLAUNCH_K8S_RANKS_PER_NODE"] == "8"
    shm = next(v for v in template["spec"]["volumes"] if v["name"] == "dshm")
    assert shm == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    assert template["spec"]["terminationGracePeriodSeconds"] == 120  # signal_lead: save first


@pytest.mark.parametrize("kind", ["jobset", "pytorchjob"])
def test_torchrun_env_from_the_completion_index_and_node_0s_dns_name(
    kind: str, tmp_path: Path
) -> None:
    docs = documents(render(_dgx(tmp_path), kind=kind))
    template = pod_templates(docs)[-1]  # a PyTorchJob's Workers: nodes 1..3
    env = pod_environment(template, index=2, restart=1)
    d = from_environ({**env, "DDLAUNCH_K8S_LOCAL_RANK": "5"})
    master = "golden-node-0-0.golden" if kind == "jobset" else "golden-master-0"
    assert torchrun_env(d) == {
        "RANK": "21",
        "LOCAL_RANK": "5",
        "WORLD_SIZE": "32",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "4",
        "NODE_RANK": "2",
        "ROLE_RANK": "21",
        "ROLE_WORLD_SIZE": "32",
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        # The JobSet's restart attempt; a PyTorchJob counts its pods' starts (job.pod).
        "TORCHELASTIC_RESTART_COUNT": "1" if kind == "jobset" else "0",
    }
    assert (d.job_id, d.restart_count) == ("golden", 1 if kind == "jobset" else 0)


def test_recovery_semantics_jobset(tmp_path: Path) -> None:
    (jobset,) = documents(render(_dgx(tmp_path, "fault_tolerance: {max_requeues: 5}\n")))
    assert jobset["spec"]["failurePolicy"] == {
        "maxRestarts": 5,
        "rules": [
            {
                "name": "ddlaunchStop",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 0  # any pod failure: the JobSet restarts every pod
    assert job["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [STOP_EXIT]},
        }
    ]
    template = job["template"]
    assert template["spec"]["restartPolicy"] == "Never"
    tolerations = template["spec"]["tolerations"]
    assert tolerations[-2:] == [
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
    ]


def test_recovery_semantics_pytorchjob(tmp_path: Path) -> None:
    docs = documents(
        render(
            _dgx(tmp_path),
            ["kubernetes.node_unreachable_seconds=10", "fault_tolerance.max_requeues=2"],
            kind="pytorchjob",
        )
    )
    (job,) = docs
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {r: (s["replicas"], s["restartPolicy"]) for r, s in specs.items()} == {
        "Master": (1, "ExitCode"),
        "Worker": (3, "ExitCode"),
    }
    assert job["spec"]["runPolicy"] == {"backoffLimit": 2, "cleanPodPolicy": "All"}
    # The operator's ExitCode policy: >= 128 (138 = its user-defined retryable) restarts,
    # below 128 is permanent.
    assert RETRY_EXIT == 138 and STOP_EXIT < 128
    unreachable = specs["Master"]["template"]["spec"]["tolerations"][-2]
    assert unreachable["tolerationSeconds"] == 10
    assert [container_of(t)["name"] for t in pod_templates(docs)] == ["pytorch", "pytorch"]


def test_gang_options(tmp_path: Path) -> None:
    kueue = workload(documents(render(_dgx(tmp_path), gang="kueue")))
    assert kueue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    docs = documents(render(_dgx(tmp_path), ["kubernetes.gang_timeout=600"], gang="coscheduling"))
    podgroup, _ = docs
    assert podgroup == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "golden"},
        "spec": {"minMember": 4, "scheduleTimeoutSeconds": 600},
    }
    (template,) = pod_templates(docs)
    assert template["metadata"]["labels"] == {"scheduling.x-k8s.io/pod-group": "golden"}
    assert template["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    none = pod_templates(documents(render(_dgx(tmp_path))))[0]
    assert "schedulerName" not in none["spec"] and "metadata" not in none


def test_site_settings_reach_the_pod(tmp_path: Path) -> None:
    prepared = render(
        _dgx(tmp_path),
        [
            "kubernetes.namespace=ml",
            "kubernetes.service_account=trainer",
            "kubernetes.priority_class=high",
            'kubernetes.node_selector={"nvidia.com/gpu.product": "H100-SXM"}',
            "kubernetes.tolerations=[nvidia.com/gpu:NoSchedule, dedicated=ml:NoExecute]",
            'kubernetes.resources={"cpu": "100", "ephemeral-storage": "200Gi"}',
            "storage.scratch=/local/scratch",
        ],
    )
    docs = documents(prepared)
    (template,) = pod_templates(docs)
    spec = template["spec"]
    assert workload(docs)["metadata"]["namespace"] == "ml"
    assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("trainer", "high")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "H100-SXM"}
    assert spec["tolerations"][:2] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
    ]
    requests = container_of(template)["resources"]["requests"]
    assert (requests["cpu"], requests["ephemeral-storage"]) == ("100", "200Gi")
    assert {"name": "scratch", "emptyDir": {}} in spec["volumes"]
    assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000}


def test_setup_lines_run_before_the_entry_as_shell_code(tmp_path: Path) -> None:
    (template,) = pod_templates(
        documents(render(_dgx(tmp_path), ["launch.setup=[source /venv/bin/activate]"]))
    )
    assert container_of(template)["command"] == [
        "/bin/bash",
        "-c",
        'source /venv/bin/activate\nexec "$@"',
        "ddlaunch-setup",
        "python3",
        "-u",
        "-m",
        "ddlaunch.job.pod",
    ]


def _error(tmp_path: Path, overrides: list[str], **kw: object) -> str:
    with pytest.raises(ConfigError) as info:
        render(_dgx(tmp_path), overrides, **kw)  # type: ignore[arg-type]
    return str(info.value)


def test_errors(tmp_path: Path) -> None:
    assert (
        "container.image: --target kubernetes runs the ranks in an image: set container.image"
        in _error(tmp_path, [], image=None)
    )
    assert (
        "kubernetes.queue: must be a Kubernetes name: at most 63 lower-case letters, digits "
        "and -, starting and ending with a letter or digit; got 'Team_A' (--set "
        "kubernetes.queue=Team_A)"
    ) in _error(tmp_path, ["kubernetes.queue=Team_A"], gang="kueue")
    assert (
        "nodes.gpus_per_node: asks for 16 GPUs per node but the cluster preset 'dgx-h100' has 8"
    ) in _error(tmp_path, ["nodes.gpus_per_node=16"])
    assert "kubernetes.queue: gang: kueue needs the LocalQueue" in _error(
        tmp_path, ["kubernetes.gang=kueue"]
    )
    # The run root outside every volume (render() puts one on the root's top directory).
    off_volume = _error(tmp_path, ['kubernetes.volumes={"/data": "pvc:data"}'], root="/runs")
    assert "/runs (storage.run_root) is on no writable kubernetes.volumes mount" in (off_volume)
    assert "'/images/pt.sqsh' is an image file" in _error(
        tmp_path, ["container.image=/images/pt.sqsh"]
    )
    assert "kubernetes.resources.nvidia.com/gpu: is set by ddlaunch" in _error(
        tmp_path, ['kubernetes.resources={"nvidia.com/gpu": "4"}']
    )
    assert "kubernetes.tolerations: entry 1: expected key[=value]:Effect" in _error(
        tmp_path, ["kubernetes.tolerations=[gpu]"]
    )
    assert "kubernetes.volumes./shared: expected pvc:CLAIM, nfs:SERVER:/export or host:/path" in (
        _error(tmp_path, ['kubernetes.volumes={"/shared": "s3:bucket"}'])
    )
    slurm_only = "act inside a Slurm allocation; not on Kubernetes"
    assert f"fault_tolerance.spare_nodes: hot spares and elastic shrink {slurm_only}" in _error(
        tmp_path, ["fault_tolerance.spare_nodes=1"]
    )
    assert f"nodes.min: hot spares and elastic shrink {slurm_only}" in _error(
        tmp_path, ["nodes.min=1"]
    )


def test_replica_groups_are_refused_with_what_to_do(tmp_path: Path) -> None:
    # A valid replica-groups config (4 nodes, 2 groups): only the target refuses it.
    sets = ["fault_tolerance.mode=replica_groups", "parallel.dp_replicate=2"]
    with pytest.raises(ConfigError) as info:
        render(_dgx(tmp_path), sets)
    assert [str(issue) for issue in info.value.issues] == [
        "fault_tolerance.mode: replica_groups is not built for --target kubernetes (each group "
        "would need its own independently restarting replicated job plus a lighthouse "
        "service); use fault_tolerance.mode: job there, or submit to Slurm"
    ]
    assert documents(render(_dgx(tmp_path), ["parallel.dp_replicate=2"]))  # mode: job renders


def test_nfs_and_read_only_volumes(tmp_path: Path) -> None:
    (template,) = pod_templates(
        documents(
            render(
                _dgx(tmp_path),
                [
                    'kubernetes.volumes={"/shared": "nfs:fs.example:/export/shared", '
                    '"/data": "pvc:data:ro"}'
                ],
            )
        )
    )
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["volume-0"] == {
        "name": "volume-0",
        "persistentVolumeClaim": {"claimName": "data", "readOnly": True},
    }
    assert volumes["volume-1"] == {
        "name": "volume-1",
        "nfs": {"server": "fs.example", "path": "/export/shared"},
    }
    mounts = container_of(template)["volumeMounts"]
    assert {"name": "volume-0", "mountPath": "/data", "readOnly": True} in mounts


def test_the_manifest_is_yaml_of_plain_scalars() -> None:
    text = render("examples/mlp").manifest
    assert text.startswith("# ddlaunch ") and "\n---\n" in text
    docs = list(yaml.safe_load_all(text))  # safe: no tags, no Python objects
    assert [d["kind"] for d in docs] == ["JobSet"]


def test_kubernetes_guide_states_the_exit_codes_and_defaults_the_code_uses() -> None:
    from ddlaunch.config.kubernetes import KubernetesSpec

    section = (REPO / "docs" / "how-to" / "kubernetes.md").read_text()
    spec = KubernetesSpec()
    assert f"| requeue | {RETRY_EXIT} |" in section
    assert f"| {STOP_EXIT} | `podFailurePolicy` `FailJob` on {STOP_EXIT}" in section
    assert f"tolerations with {spec.node_unreachable_seconds} s" in section
    assert f"port {spec.master_port}" in section


def test_cli_reports_every_problem_of_the_target_at_once(tmp_path: Path) -> None:
    # No image, the run root on no volume, a Slurm-only key: one render names all three.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlaunch",
            "render",
            "examples/mlp",
            "--target",
            "kubernetes",
            "--run-id",
            "r1",
            "--run-root",
            "/runs",
            "--set",
            "fault_tolerance.spare_nodes=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SLURM_CONF": str(tmp_path / "no-slurm.conf")},
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (3 errors):\n"
        "  container.image: --target kubernetes runs the ranks in an image: set "
        "container.image (e.g. nvcr.io/nvidia/pytorch:24.05-py3, with ddlaunch installed or "
        "on a kubernetes.volumes mount)\n"
        "  kubernetes.volumes: /runs (storage.run_root) is on no writable "
        "kubernetes.volumes mount (mounts: none): the pods write the attempts, logs and "
        "checkpoints there, and ddlaunch reads them back from here\n"
        "  fault_tolerance.spare_nodes: hot spares and elastic shrink act inside a Slurm "
        "allocation; not on Kubernetes\n"
    )
