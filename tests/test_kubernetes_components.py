"""``components:`` on ``--target kubernetes``: one JobSet with a replicated job per component
(the whole manifest of two train components and a service, checked against the typed models),
the ranks of every train component as one world numbered component by component, a
service's pod running its own command, the refusals with their messages, and a pipeline's.

Regenerate the golden after an intended change with:
  DDLAUNCH_UPDATE_GOLDEN=1 pytest tests/test_kubernetes_components.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube import (
    ROOT,
    container_of,
    documents,
    k8s_overrides,
    pod_environment,
    pod_templates,
    render,
    workload,
)
from support.kube_models import validate_manifest
from support.kubectl_offline import dry_run_create, kubectl

from ddlaunch.app.kubernetes import create_run_dir, prepare_objects
from ddlaunch.config import ConfigError
from ddlaunch.launch.local import free_local_port
from ddlaunch.pipelines.submit import KUBERNETES_REFUSED
from ddlaunch.planning import pod_env
from ddlaunch.planning.kubernetes import object_name
from ddlaunch.planning.kubernetes_components import name_limit
from ddlaunch.runner import SubprocessRunner
from ddlaunch.worker.distenv import from_environ, torchrun_env

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden" / "kubernetes_components" / "jobset-coscheduling.yaml"
UPDATE = os.environ.get("DDLAUNCH_UPDATE_GOLDEN") == "1"

H100, A100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"
COMPONENTS = [
    {"name": "fast", "nodes": {"count": 1, "gpu_type": H100, "mem": "512G"}},
    {"name": "slow_a100", "nodes": {"count": 2, "gpu_type": A100}},
    {
        "name": "reward",
        "role": "service",
        "nodes": {"count": 1, "gpus_per_node": 1, "gpu_type": L40S},
        "launch": {
            "command": ["python3", "-m", "reward.serve", "--port", "8000"],
            "env": {"MODEL": "rm-7b", "HF_HOME": "/shared/reward-hf"},
        },
    },
]
SETS = [
    f"components={json.dumps(COMPONENTS)}",
    'launch.env={"HF_HOME": "/shared/hf"}',
    "fault_tolerance.max_restarts=2",
]


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # config sources are shown relative to the working directory


def _jobset(sets: list[str] = SETS, **kw: Any) -> dict[str, Any]:
    return workload(documents(render("examples/mlp", sets, **kw)))


def _rjobs(jobset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rj["name"]: rj["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]}


def _env(template: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container_of(template)["env"]}


def test_golden_manifest_of_two_train_components_and_a_service() -> None:
    prepared = render("examples/mlp", SETS, gang="coscheduling")
    if UPDATE:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(prepared.manifest)
    assert prepared.manifest == GOLDEN.read_text(), (
        f"the components' manifest renders differently from {GOLDEN.relative_to(REPO)}; if "
        "intended, regenerate with DDLAUNCH_UPDATE_GOLDEN=1 pytest "
        "tests/test_kubernetes_components.py"
    )
    docs = documents(prepared)
    validate_manifest(docs)
    podgroup, _ = docs
    assert podgroup["spec"] == {"minMember": 4}  # every component's pods: 1 + 2 + 1
    assert prepared.plan.master_addr == "golden-fast-0-0.golden"


def test_each_component_is_a_replicated_job_of_its_own_shape() -> None:
    jobset = _jobset()
    rjobs = _rjobs(jobset)
    assert list(rjobs) == ["fast", "slow-a100", "reward"]
    assert [(j["parallelism"], j["completions"], j["completionMode"]) for j in rjobs.values()] == [
        (1, 1, "Indexed"),
        (2, 2, "Indexed"),
        (1, 1, "Indexed"),
    ]
    pods = {name: job["template"]["spec"] for name, job in rjobs.items()}
    assert {name: pod["nodeSelector"] for name, pod in pods.items()} == {
        "fast": {"nvidia.com/gpu.product": H100},
        "slow-a100": {"nvidia.com/gpu.product": A100},
        "reward": {"nvidia.com/gpu.product": L40S},
    }
    assert {name: container_of(job["template"])["resources"] for name, job in rjobs.items()} == {
        "fast": {
            "requests": {"cpu": "2", "memory": "512Gi", "nvidia.com/gpu": "2"},
            "limits": {"memory": "512Gi", "nvidia.com/gpu": "2"},
        },
        "slow-a100": {
            "requests": {"cpu": "2", "nvidia.com/gpu": "2"},
            "limits": {"nvidia.com/gpu": "2"},
        },
        # A service asks for the GPUs it names and no CPUs, as its Slurm component does.
        "reward": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
    }
    # Every pod of the JobSet on a node of its own, whatever its component.
    terms = {
        json.dumps(
            pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        )
        for pod in pods.values()
    }
    assert terms == {
        json.dumps(
            [
                {
                    "labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "golden"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        )
    }


def test_a_failed_service_pod_is_replaced_alone_and_the_training_decides_the_end() -> None:
    jobset = _jobset()
    rjobs = _rjobs(jobset)
    service = rjobs["reward"]
    # The Job controller replaces a failed pod (same hostname), up to max_restarts times;
    # no podFailurePolicy: a service's exit code means nothing to ddlaunch.
    assert (service["backoffLimit"], "podFailurePolicy" in service) == (2, False)
    assert service["template"]["spec"]["restartPolicy"] == "Never"
    for train in ("fast", "slow-a100"):
        assert rjobs[train]["backoffLimit"] == 0  # a rank's pod failing: the gang restarts
        assert rjobs[train]["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    assert jobset["spec"]["successPolicy"] == {
        "operator": "All",
        "targetReplicatedJobs": ["fast", "slow-a100"],
    }
    assert jobset["spec"]["failurePolicy"] == {
        "maxRestarts": 3,
        "rules": [
            {
                "name": "ddlaunchStop",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "targetReplicatedJobs": ["fast", "slow-a100"],
            },
            {
                "name": "ddlaunchService",
                "action": "RestartJobSet",
                "targetReplicatedJobs": ["reward"],
            },
        ],
    }


def test_every_pod_is_told_every_components_pods_by_their_dns_names() -> None:
    rjobs = _rjobs(_jobset())
    told = {
        "DDLAUNCH_TRAIN_COMPONENTS": "fast:2,slow_a100:4",
        "DDLAUNCH_COMPONENT_FAST_NODES": "golden-fast-0-0.golden",
        "DDLAUNCH_COMPONENT_FAST_ADDR": "golden-fast-0-0.golden",
        "DDLAUNCH_COMPONENT_SLOW_A100_NODES": (
            "golden-slow-a100-0-0.golden,golden-slow-a100-0-1.golden"
        ),
        "DDLAUNCH_COMPONENT_SLOW_A100_ADDR": "golden-slow-a100-0-0.golden",
        "DDLAUNCH_COMPONENT_REWARD_NODES": "golden-reward-0-0.golden",
        "DDLAUNCH_COMPONENT_REWARD_ADDR": "golden-reward-0-0.golden",
    }
    for name, job in rjobs.items():
        env = _env(job["template"])
        assert {k: env[k] for k in told} == told, name
    service = container_of(rjobs["reward"]["template"])
    assert service["name"] == "reward" and "ports" not in service
    assert service["command"] == ["python3", "-m", "reward.serve", "--port", "8000"]
    assert service["env"] == [
        {"name": "DDLAUNCH_RUN_DIR", "value": "/shared/runs/golden"},
        {"name": "DDLAUNCH_RUN_ID", "value": "golden"},
        *({"name": k, "value": v} for k, v in told.items()),
        {"name": "MODEL", "value": "rm-7b"},
        {"name": "HF_HOME", "value": "/shared/reward-hf"},  # its own launch.env wins
    ]


@pytest.mark.parametrize(
    ("rjob", "index", "local", "rank", "node"),
    [("fast", 0, 1, 1, 0), ("slow-a100", 0, 0, 2, 1), ("slow-a100", 1, 1, 5, 2)],
)
def test_the_train_components_ranks_are_one_world_component_by_component(
    rjob: str, index: int, local: int, rank: int, node: int
) -> None:
    template = _rjobs(_jobset())[rjob]["template"]
    env = pod_environment(template, index=index, restart=1)
    d = from_environ({**env, pod_env.LOCAL_RANK_VAR: str(local)})
    assert torchrun_env(d) == {
        "RANK": str(rank),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": "3",
        "NODE_RANK": str(node),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": "6",
        "MASTER_ADDR": "golden-fast-0-0.golden",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }


def test_a_pods_identity_adds_its_components_node_offset_to_its_completion_index() -> None:
    env = {
        pod_env.NODE_INDEX_VAR: "1",  # the second pod of its own Job
        pod_env.NODE_OFFSET_VAR: "3",  # after 3 nodes of the train components before it
        pod_env.NODES_VAR: "5",
        pod_env.RANKS_PER_NODE_VAR: "8",
        pod_env.MASTER_ADDR_VAR: "r-first-0-0.r",
        pod_env.COMPONENT_VAR: "second",
        pod_env.JOB_VAR: "r",
    }
    pod = pod_env.PodIdentity.from_env(env)
    assert (pod.index, pod.nodes, pod.leader, pod.component) == (4, 5, False, "second")
    d = from_environ({**env, "SUBMITIT_EXECUTOR": "kubernetes", pod_env.LOCAL_RANK_VAR: "7"})
    assert (d.rank, d.world_size, d.node_rank) == (39, 40, 4)
    with pytest.raises(ValueError, match=r"node index 5 is outside 0\.\.4"):
        pod_env.PodIdentity.from_env({**env, pod_env.NODE_INDEX_VAR: "2"})


def test_the_jobset_name_leaves_room_for_long_component_names() -> None:
    long = "a_long_component_name_for_pods"  # 30 characters, 12 pods
    sets = [*k8s_overrides(), f"components={json.dumps([{'name': long, 'nodes': {'count': 12}}])}"]
    run_id = "mlp-example-20260101-120000-ab12cd34"
    prepared = prepare_objects(
        "examples/mlp", sets, run_id=run_id, run_root=ROOT, snapshot="skip", run_as=(1, 1)
    )
    # <name>-<rjob>-0-11 and the Job controller's 6-character suffix: at most 63.
    assert name_limit(prepared.config, 40) == 63 - len("-a-long-component-name-for-pods-0-11") - 6
    name = prepared.plan.name
    assert name == object_name(run_id, 21) == "mlp-exampl-6677c9cd0c"  # cut, with a digest
    assert object_name(run_id) == "mlp-example-20260101-120000-ab12cd34"  # without components
    hosts = _env(pod_templates(documents(prepared))[0])[
        "DDLAUNCH_COMPONENT_A_LONG_COMPONENT_NAME_FOR_PODS_NODES"
    ]
    assert hosts is not None and max(len(h.split(".")[0]) for h in hosts.split(",")) + 6 == 63


def _start(template: dict[str, Any], run_dir: Path, index: int, port: int) -> subprocess.Popen[str]:
    """A pod as a local process: the container's environment and command, the first train
    pod's DNS name replaced by 127.0.0.1 (``test_kubernetes_pod`` does the same)."""
    env = pod_environment(template, index=index, node=f"pod-{index}")
    env.update(
        DDLAUNCH_K8S_MASTER_ADDR="127.0.0.1",
        DDLAUNCH_MASTER_PORT=str(port),
        PATH=os.environ["PATH"],
        HOME=str(run_dir.parent),
        PYTHONPATH=f"{REPO}:{TESTS}",
        OMP_NUM_THREADS="1",
    )
    command = container_of(template)["command"]
    return subprocess.Popen(
        command, env=env, cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_rendered_pods_of_two_train_components_train_as_one_world(tmp_path: Path) -> None:
    """Each train component's pod runs its container's command with its environment: the
    second component's ranks are 2 and 3 of one gloo world of 4; node 0 (the first
    component's pod) concludes, the other pod leaves on its decision; the service's pod runs
    its own command with its own variables."""
    server = TESTS / "trainer_scripts" / "pid_server.py"
    service_port = free_local_port()
    config = tmp_path / "components.yaml"
    config.write_text(
        "job: {name: comps}\n"
        "nodes: {gpus_per_node: 0}\n"
        "launch: {entrypoint: 'launch_entrypoints:world_info', backend: gloo, "
        f"python: '{sys.executable}'}}\n"
        "container: {image: 'python:3.11'}\n"
        f"kubernetes: {{volumes: {{'{tmp_path}': 'pvc:shared'}}}}\n"
        "components:\n"
        "  - {name: first, nodes: {count: 1, tasks_per_node: 2}}\n"
        "  - {name: second, nodes: {count: 1, tasks_per_node: 2}}\n"
        "  - name: server\n"
        "    role: service\n"
        f"    launch: {{command: ['{sys.executable}', '{server}', --port, '{service_port}'], "
        "env: {SERVED: 'yes'}}\n"
    )
    prepared = prepare_objects(
        str(config), run_id="comps", run_root=str(tmp_path / "runs"), snapshot="skip"
    )
    run_dir = create_run_dir(prepared, SubprocessRunner(), str(tmp_path)).path
    first, second, service = (
        rj["template"]["spec"]["template"]
        for rj in workload(documents(prepared))["spec"]["replicatedJobs"]
    )
    assert _env(service)["SERVED"] == "yes"
    port = free_local_port()
    service_pod = _start(service, run_dir, 0, port)
    pods = [_start(first, run_dir, 0, port), _start(second, run_dir, 0, port)]
    try:
        results = []
        for proc in pods:
            try:
                text, _ = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
            results.append((proc.returncode, text))
        assert [code for code, _ in results] == [0, 0], results
        records = [json.loads((run_dir / "out" / f"rank-{r}.json").read_text()) for r in range(4)]
        assert [(r["rank"], r["local_rank"], r["world_size"]) for r in records] == [
            (0, 0, 4),
            (1, 1, 4),
            (2, 0, 4),
            (3, 1, 4),
        ]
        assert {r["rank_sum"] for r in records} == {6.0}
        assert "pod of node 1/2" in results[1][1] and "node 0 concluded: completed" in results[1][1]
        deadline = time.monotonic() + 60
        while not (found := list((run_dir / "out").glob("server-*"))):
            assert time.monotonic() < deadline, service_pod.poll()
            time.sleep(0.1)
        (started,) = found  # the service's pod ran its own command
        assert started.read_text() == f"{os.uname().nodename}:{service_port}\n"
    finally:
        service_pod.kill()
        service_pod.communicate()


def _refusals(sets: list[str], **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        render("examples/mlp", sets, **kw)
    return [str(issue) for issue in info.value.issues]


def test_what_components_cannot_be_on_kubernetes_is_refused_each_with_its_reason() -> None:
    bad = [
        {"name": "fast_", "nodes": {"count": 1, "partition": "h100", "constraint": "ib"}},
        {"name": "slow", "nodes": {"count": 1, "gpu_type": "a100_"}},
        {"name": "x" * 40, "nodes": {"count": 1}},
        {
            "name": "server",
            "role": "service",
            "nodes": {"count": 1, "tasks_per_node": 2},
            "launch": {"command": ["serve"]},
        },
    ]
    placed = (
        "on Kubernetes a component's pods are placed by nodes.gpu_type (nodeSelector "
        "nvidia.com/gpu.product) and kubernetes.node_selector"
    )
    assert _refusals([f"components={json.dumps(bad)}"], kind="pytorchjob") == [
        "kubernetes.kind: components render as the replicated jobs of one JobSet; a "
        "PyTorchJob has one pod shape for its workers: use kind: jobset",
        "components.0.name: 'fast_' cannot name the component's JobSet replicated job (a "
        "Kubernetes name ends with a letter or digit): drop the trailing _",
        f"components.0.nodes.partition: a Slurm partition; {placed}",
        f"components.0.nodes.constraint: Slurm node features; {placed}",
        "components.1.nodes.gpu_type: 'a100_' is not a Kubernetes label value (the pods' "
        "nodeSelector nvidia.com/gpu.product: <gpu_type>)",
        f"components.2.name: '{'x' * 40}' is too long for its pods' names (<jobset>-"
        f"{'x' * 40}-0-<index>, at most 63 characters): at most 36 characters on Kubernetes",
        "components.3.nodes.tasks_per_node: a service's pod runs launch.command once; 2 "
        "copies per node are srun's (start them from the command on Kubernetes)",
    ]


def test_the_gpu_type_label_is_a_label_key() -> None:
    assert _refusals(["kubernetes.gpu_type_label=not a label"]) == [
        "kubernetes.gpu_type_label: must be a Kubernetes label key such as "
        "nvidia.com/gpu.product, got 'not a label' (--set kubernetes.gpu_type_label=not a label)"
    ]
    other = COMPONENTS[:1]
    sets = [f"components={json.dumps(other)}", "kubernetes.gpu_type_label=example.com/gpu"]
    (job,) = _rjobs(_jobset(sets)).values()
    assert job["template"]["spec"]["nodeSelector"] == {"example.com/gpu": H100}


def test_a_pipeline_on_kubernetes_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("stages:\n  train: {config: examples/mlp}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "pipeline", "p.yaml", "--target", "kubernetes"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {KUBERNETES_REFUSED}\n")
    assert KUBERNETES_REFUSED == (
        "a pipeline runs on Slurm only: its stages wait for each other as Slurm jobs (sbatch "
        "--dependency), and Kubernetes has no wait of one JobSet for another (a JobSet's "
        "dependsOn orders the replicated jobs inside one JobSet); submit each stage with "
        "ddlaunch submit --target kubernetes once the stages it waits for are done"
    )
    assert not list(tmp_path.glob("runs*"))  # nothing created


@pytest.mark.skipif(kubectl() is None, reason="no kubectl (scripts/test-all installs one)")
def test_kubectl_parses_the_components_manifest(tmp_path: Path) -> None:
    prepared = render("examples/mlp", SETS, gang="coscheduling")
    manifest = tmp_path / "kubernetes.yaml"
    manifest.write_text(prepared.manifest)
    proc, _ = dry_run_create(manifest, tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = list(yaml.safe_load_all(proc.stdout))
    for doc in printed:
        doc["metadata"].pop("namespace")
    assert printed == documents(prepared)
