"""No config string can inject a command into the rendered script.

Each string field is set in turn to hostile values. The outcome must be either a clean
ConfigError (fields that go into #SBATCH lines only accept Slurm tokens) or a script that
passes ``bash -n`` and whose preamble (everything before the launch line) creates no file
when run.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddlaunch.app.prepare import prepare
from ddlaunch.config import Config, ConfigError
from ddlaunch.errors import UserError

HOSTILE = [
    "a b",
    "a'b",
    'a"b',
    "$(touch X)",
    "`touch X`",
    "a;touch X",
    "a\ntouch X",
    "a&&touch X",
    "a|touch X",
    "${IFS}touch${IFS}X",
    "\\$(touch X)",
]
# launch.setup is shell code by definition (verbatim lines), so it is not a data field.
SHELL_CODE_FIELDS = {"launch.setup"}
BASE = "examples/mlp"


def string_fields(cls: type = Config, prefix: str = "") -> list[tuple[str, bool]]:
    """(key path, is_list) for every str / str-list field of the schema."""
    out: list[tuple[str, bool]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += string_fields(tp, f"{key}.")
        elif key not in SHELL_CODE_FIELDS and ("str" in str(tp) or tp is str):
            out.append((key, "tuple" in str(tp) or "dict" in str(tp)))
    return out


def overrides_for(key: str, is_collection: bool, value: str) -> list[str]:
    if key == "launch.env":
        return [f"launch.env={json.dumps({'EVIL': value})}"]
    if key == "sbatch":
        return [f"sbatch={json.dumps({'comment': value})}"]
    if key == "params":
        return [f"params={json.dumps({'x': value})}"]
    if key in ("storage.checkpoint_dir",):
        value = "/abs/" + value
    if key == "launch.script":
        return ["launch.entrypoint=null", f"launch.script={json.dumps(value)}"]
    encoded = json.dumps([value] if is_collection else value)  # JSON is valid YAML
    return [f"{key}={encoded}"]


def preamble(script: str) -> str:
    return script.split("# ---- launch", 1)[0]


CASES = [(key, coll, v) for key, coll in string_fields() for v in HOSTILE]


@pytest.mark.parametrize(
    ("key", "is_collection", "value"), CASES, ids=[f"{k}={v!r}" for k, _, v in CASES]
)
def test_hostile_string_is_inert(key: str, is_collection: bool, value: str, tmp_path: Path) -> None:
    overrides = overrides_for(key, is_collection, value)
    try:
        script = prepare(
            BASE, overrides, run_id="inj", run_root=str(tmp_path / "runs"), workdir=str(tmp_path)
        ).script
    except ConfigError as exc:
        # A rejection must name the key, not fail somewhere else.
        assert key.split(".")[0] in str(exc)
        return
    except UserError as exc:
        # e.g. a template name that does not exist: a clean one-line error naming it.
        assert value in str(exc)
        return
    syntax = subprocess.run(
        ["bash", "-n"], input=script, text=True, capture_output=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(
        ["bash", "-c", preamble(script)], cwd=work, capture_output=True, check=False, timeout=30
    )
    assert not (work / "X").exists(), f"{key}={value!r} executed a command"
    assert list(work.iterdir()) == [], list(work.iterdir())


def test_every_string_field_is_covered() -> None:
    keys = {k for k, _ in string_fields()}
    assert {"job.name", "storage.run_root", "launch.python", "launch.env", "sbatch"} <= keys


# ---- the same sweep on the Kubernetes render (render --target kubernetes) ----------------

MARKER = "ddlmark7"


def _k8s_render(overrides: list[str], tmp_path: Path) -> list[Any]:
    from support.kube import k8s_overrides

    from ddlaunch.app.kubernetes import prepare_objects

    prepared = prepare_objects(
        BASE,
        [*k8s_overrides("/shared/runs"), *overrides],
        run_id="inj",
        run_root="/shared/runs",
        workdir=str(tmp_path),
        snapshot="skip",
        run_as=(1000, 1000),
    )
    return list(yaml.safe_load_all(prepared.manifest))


def _k8s_overrides(key: str, is_collection: bool, value: str) -> list[str]:
    if key in (
        "storage.run_root",
        "storage.checkpoint_dir",
        "storage.scratch",
        "trainer.checkpoint_dir",
    ):
        value = "/shared/" + value  # on the volume, or the render stops there on purpose
        return [f"{key}={json.dumps(value)}"]
    if key == "container.image":
        return [f"container.image={json.dumps(value)}"]
    if key == "kubernetes.volumes":
        return [f"kubernetes.volumes={json.dumps({'/shared': 'pvc:x', '/v': value})}"]
    if key in ("kubernetes.node_selector", "kubernetes.resources", "kubernetes.rdma"):
        return [f"{key}={json.dumps({'example.com/k': value})}"]
    return overrides_for(key, is_collection, value)


def _same_shape(hostile: Any, benign: Any, value: str, path: str = "") -> None:
    """``hostile`` is ``benign`` with the marker replaced by the value, and nothing else:
    same keys, same list lengths, the value only ever inside the scalars that held the
    marker."""
    if isinstance(benign, dict):
        assert isinstance(hostile, dict) and list(hostile) == [
            k.replace(MARKER, value) for k in benign
        ], path
        for (hk, hv), bv in zip(hostile.items(), benign.values(), strict=True):
            _same_shape(hv, bv, value, f"{path}.{hk}")
    elif isinstance(benign, list):
        assert isinstance(hostile, list) and len(hostile) == len(benign), path
        for i, (h, b) in enumerate(zip(hostile, benign, strict=True)):
            _same_shape(h, b, value, f"{path}[{i}]")
    elif isinstance(benign, str):
        assert hostile == benign.replace(MARKER, value), (path, hostile)
    else:
        assert hostile == benign, path


K8S_CASES = [(key, coll, v) for key, coll in string_fields() for v in HOSTILE]


@pytest.mark.parametrize(
    ("key", "is_collection", "value"), K8S_CASES, ids=[f"{k}={v!r}" for k, _, v in K8S_CASES]
)
def test_hostile_string_stays_one_yaml_scalar_in_the_kubernetes_render(
    key: str, is_collection: bool, value: str, tmp_path: Path
) -> None:
    try:
        hostile = _k8s_render(_k8s_overrides(key, is_collection, value), tmp_path)
    except ConfigError as exc:
        assert key.split(".")[0] in str(exc) or "kubernetes" in str(exc)
        return
    benign = _k8s_render(_k8s_overrides(key, is_collection, MARKER), tmp_path)
    _same_shape(hostile, benign, value)
    for doc in hostile:
        for template in _pod_templates(doc):
            (main,) = template["spec"]["containers"]
            # An argv, never a shell line: the entry's arguments are the config's strings.
            assert main["command"][1:] == ["-u", "-m", "ddlaunch.job.pod"], main["command"]


def _pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in doc["spec"]["replicatedJobs"]]
    if doc["kind"] == "PyTorchJob":
        return [s["template"] for s in doc["spec"]["pytorchReplicaSpecs"].values()]
    return []
