"""Offline validation of every ``--target kubernetes`` render: the typed models shipped on PyPI
(``support.kube_models``: the kubernetes client, kubeflow-training, kubeflow-trainer-api's
JobSet, the PodGroup schema written from scheduler-plugins' API), and kubectl's own parse of
the manifest (``kubectl create --dry-run=client --validate=false -o yaml -f``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from support.kube import GANGS, documents, render
from support.kube_models import Invalid, validate_manifest
from support.kubectl_offline import dry_run_create, kubectl

from ddlaunch.config.load import list_presets

EXAMPLES = [n for n in list_presets() if n.startswith("examples/")]
CASES = [(e, k, g) for e in EXAMPLES for k in ("jobset", "pytorchjob") for g in GANGS]


@pytest.mark.parametrize(("name", "kind", "gang"), CASES, ids=["-".join(c) for c in CASES])
def test_every_example_renders_to_valid_objects(name: str, kind: str, gang: str) -> None:
    docs = documents(render(name, kind=kind, gang=gang))
    validate_manifest(docs)
    assert [d["kind"] for d in docs][-1] == ("JobSet" if kind == "jobset" else "PyTorchJob")


def test_the_validation_catches_what_matters() -> None:
    """The checker is strict where the generated models are lax: unknown keys, a string
    where an integer belongs, a missing required field, an operator rule broken."""
    jobset = documents(render("examples/mlp"))
    pod = jobset[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    mutations = {
        "unknown field of V1Container": lambda d, p: p["containers"][0].update(bogus=1),
        "expected int, got str": lambda d, p: p["tolerations"][0].update(tolerationSeconds="30"),
        "Invalid value for `name`, must not be `None`": lambda d, p: p["containers"][0].pop("name"),
        "unknown field of JobsetV1alpha2FailurePolicy": lambda d, p: d[0]["spec"][
            "failurePolicy"
        ].update(maxRestart=3),
        "podFailurePolicy needs the pod's restartPolicy Never": lambda d, p: p.update(
            restartPolicy="OnFailure"
        ),
    }
    for message, mutate in mutations.items():
        bad = copy.deepcopy(jobset)
        mutate(bad, bad[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])
        with pytest.raises(Invalid, match=message.replace("(", r"\(").replace("`", ".")):
            validate_manifest(bad)
    assert pod["restartPolicy"] == "Never"  # the original is untouched
    pytorch = documents(render("examples/mlp", kind="pytorchjob", gang="coscheduling"))
    bad = copy.deepcopy(pytorch)
    bad[0]["spec"]["minMember"] = "2"
    with pytest.raises(Invalid, match="'2' is not of type 'integer'"):
        validate_manifest(bad)
    bad = copy.deepcopy(pytorch)
    bad[1]["spec"]["runPolicy"]["backoffLimit"] = "3"
    with pytest.raises(Invalid, match="backoffLimit: expected int"):
        validate_manifest(bad)


GOLDEN_CASES = [(k, g) for k in ("jobset", "pytorchjob") for g in GANGS]


@pytest.mark.skipif(kubectl() is None, reason="no kubectl (scripts/test-all installs one)")
@pytest.mark.parametrize(("kind", "gang"), GOLDEN_CASES, ids=[f"{k}-{g}" for k, g in GOLDEN_CASES])
def test_kubectl_parses_the_manifest(kind: str, gang: str, tmp_path: Path) -> None:
    prepared = render("examples/mlp", kind=kind, gang=gang)
    manifest = tmp_path / "kubernetes.yaml"
    manifest.write_text(prepared.manifest)
    proc, served = dry_run_create(manifest, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # Only discovery reached the stub: a client-side dry run creates nothing.
    assert served and all(method == "GET" for method, _ in served), served
    printed = list(yaml.safe_load_all(proc.stdout))
    ours = documents(prepared)
    for doc in printed:
        doc["metadata"].pop("namespace")  # kubectl adds the context's namespace
    assert printed == ours
