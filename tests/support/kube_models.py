"""Offline validation of rendered Kubernetes objects against typed models shipped on PyPI.

* core kinds, the Job template and every pod template: the ``kubernetes`` client's models
  (``V1JobTemplateSpec``, ``V1PodTemplateSpec``, ``V1ObjectMeta``...);
* PyTorchJob: ``kubeflow-training``'s models (``KubeflowOrgV1PyTorchJob``, same generator);
* JobSet: ``kubeflow-trainer-api``'s models of ``jobset.x-k8s.io/v1alpha2`` (pydantic; the
  Kubeflow Trainer embeds JobSet specs, so it ships them);
* PodGroup (scheduler-plugins): no package ships it; ``schemas/podgroup-*.json`` is written
  from its published API (``apis/scheduling/v1alpha1/types.go``).

Stricter than the models alone: an unknown key anywhere is an error (the generated models
drop them silently), scalars must have the declared type (no "2" for an int), and required
fields and enums are what the models' own constructors check. A few rules the API server
enforces beyond the schema are checked as well (``_server_rules``).
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import kubeflow.training.models as kubeflow_models
import kubernetes.client.models as k8s_models
import pydantic
from kubeflow_trainer_api import models as trainer_models

SCHEMAS = Path(__file__).resolve().parent / "schemas"
PODGROUP_SCHEMA = SCHEMAS / "podgroup-scheduling.x-k8s.io-v1alpha1.json"


class Invalid(AssertionError):
    """The manifest breaks its schema; the message lists every problem with its path."""


def _model(name: str) -> Any:
    for module in (k8s_models, kubeflow_models):
        cls = getattr(module, name, None)
        if cls is not None:
            return cls
    raise KeyError(f"no model {name}")


def _scalar(value: Any, kind: str, path: str, errors: list[str]) -> Any:
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "datetime": isinstance(value, str),
        "date": isinstance(value, str),
        "object": True,
    }[kind]
    if not ok:
        errors.append(f"{path}: expected {kind}, got {type(value).__name__} {value!r}")
    return value


def check_generated(value: Any, type_name: str, path: str, errors: list[str]) -> Any:
    """Walk ``value`` against an OpenAPI-generator type (``V1PodSpec``, ``list[V1Volume]``,
    ``dict(str, str)``); returns the constructed model, so its setters validate too."""
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return None
        inner = type_name[5:-1]
        return [check_generated(v, inner, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return None
        inner = type_name[5:-1].split(", ", 1)[1]
        return {k: check_generated(v, inner, f"{path}.{k}", errors) for k, v in value.items()}
    if type_name in ("str", "int", "bool", "float", "datetime", "date", "object"):
        return _scalar(value, type_name, path, errors)
    cls = _model(type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} mapping, got {type(value).__name__}")
        return None
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    for key in value:
        if key not in by_json:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
    kwargs = {
        attr: check_generated(
            value[json_key], cls.openapi_types[attr], f"{path}.{json_key}", errors
        )
        for json_key, attr in by_json.items()
        if json_key in value
    }
    try:
        return cls(**kwargs)  # required fields and enums: the model's own setters
    except (ValueError, TypeError) as exc:
        errors.append(f"{path}: {type_name}: {exc}")
        return None


def _unwrap(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg)]
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def check_keys_pydantic(value: Any, annotation: Any, path: str, errors: list[str]) -> None:
    """Unknown keys anywhere below a pydantic model (pydantic itself ignores them)."""
    for option in _unwrap(annotation):
        origin = typing.get_origin(option)
        if origin is list and isinstance(value, list):
            (inner,) = typing.get_args(option)
            for i, item in enumerate(value):
                check_keys_pydantic(item, inner, f"{path}[{i}]", errors)
        elif origin is dict and isinstance(value, dict):
            inner = typing.get_args(option)[1]
            for key, item in value.items():
                check_keys_pydantic(item, inner, f"{path}.{key}", errors)
        elif isinstance(option, type) and issubclass(option, pydantic.BaseModel):
            if not isinstance(value, dict):
                continue
            fields = {f.alias or name: f for name, f in option.model_fields.items()}
            for key, item in value.items():
                if key not in fields:
                    errors.append(f"{path}.{key}: unknown field of {option.__name__}")
                else:
                    check_keys_pydantic(item, fields[key].annotation, f"{path}.{key}", errors)


def _jobset(doc: dict[str, Any], errors: list[str]) -> None:
    # The trainer-api's generated models type resource.Quantity as an object (its Go type)
    # while its JSON form is a string ("8Gi"), so they would reject every valid pod template:
    # the JobSet's own fields are checked with them, each Job template (a batch/v1 type)
    # with the kubernetes client's models, which read Quantity as a string.
    cls = trainer_models.JobsetV1alpha2JobSet
    shell = json.loads(json.dumps(doc))
    for rjob in shell.get("spec", {}).get("replicatedJobs", []):
        if isinstance(rjob, dict) and "template" in rjob:
            rjob["template"] = {}
    check_keys_pydantic(shell, cls, "JobSet", errors)
    try:
        cls.model_validate(shell)
    except pydantic.ValidationError as exc:
        errors.append(f"JobSet: {exc}")
    # The Job template and its pod template once more, with the kubernetes client's models.
    check_generated(doc.get("metadata"), "V1ObjectMeta", "JobSet.metadata", errors)
    for i, rjob in enumerate(doc.get("spec", {}).get("replicatedJobs", [])):
        where = f"JobSet.spec.replicatedJobs[{i}].template"
        check_generated(rjob.get("template"), "V1JobTemplateSpec", where, errors)


def _server_rules(doc: dict[str, Any], errors: list[str]) -> None:
    """Rules the API server applies beyond the schema, for what ddlaunch renders."""
    if doc["kind"] == "JobSet":
        for rule in doc["spec"].get("failurePolicy", {}).get("rules", []):
            if not re.match(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", rule["name"]):
                errors.append(f"failure policy rule name {rule['name']!r}")
        for rjob in doc["spec"]["replicatedJobs"]:
            job = rjob["template"]["spec"]
            pod = job["template"]["spec"]
            names = {c["name"] for c in pod["containers"]}
            if job.get("podFailurePolicy"):
                # batch/v1 validation: a pod failure policy needs restartPolicy Never, and
                # onExitCodes rules name containers of the pod.
                if pod.get("restartPolicy") != "Never":
                    errors.append("podFailurePolicy needs the pod's restartPolicy Never")
                for rule in job["podFailurePolicy"]["rules"]:
                    name = rule.get("onExitCodes", {}).get("containerName")
                    if name is not None and name not in names:
                        errors.append(f"podFailurePolicy names container {name!r}")
                    if 0 in rule.get("onExitCodes", {}).get("values", []):
                        errors.append("onExitCodes In must not contain 0")
            if job.get("completionMode") == "Indexed" and job["parallelism"] != job["completions"]:
                errors.append("a gang needs parallelism == completions")
    if doc["kind"] == "PyTorchJob":
        for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            names = [c["name"] for c in spec["template"]["spec"]["containers"]]
            if "pytorch" not in names:
                errors.append(f"{role}: the training operator needs a container named pytorch")


def validate_document(doc: dict[str, Any]) -> None:
    errors: list[str] = []
    kind = doc.get("kind")
    if kind == "JobSet":
        _jobset(doc, errors)
    elif kind == "PyTorchJob":
        check_generated(doc, "KubeflowOrgV1PyTorchJob", "PyTorchJob", errors)
    elif kind == "PodGroup":
        schema = json.loads(PODGROUP_SCHEMA.read_text())
        validator = jsonschema.Draft202012Validator(schema)
        for e in validator.iter_errors(doc):
            errors.append(f"PodGroup.{'.'.join(map(str, e.path))}: {e.message}")
        check_generated(doc.get("metadata"), "V1ObjectMeta", "PodGroup.metadata", errors)
    else:
        errors.append(f"unexpected kind {kind!r}")
    if not errors:
        _server_rules(doc, errors)
    if errors:
        raise Invalid("\n".join(errors))


def validate_manifest(documents: list[dict[str, Any]]) -> None:
    for doc in documents:
        validate_document(doc)
