"""Validation of the ``kubernetes:`` section: label keys and values, tolerations in kubectl
taint syntax, resource names and quantities, the volume grammar. Called by
``validate.check_contradictions`` with its issue collector. What needs the run directory or
the target (an image, the run root on a volume) is checked when the manifest is planned
(``planning.kubernetes``)."""

from __future__ import annotations

import re

from ddlaunch.config.container_rules import Collector
from ddlaunch.config.fields import PATTERNS
from ddlaunch.config.schema import Config

# Kubernetes' qualified names (label keys, resource names): an optional DNS-subdomain
# prefix and "/", then up to 63 letters, digits, -, _ and . (apimachinery validation).
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION = re.compile(r"^(?P<key>[^=:]+)(=(?P<value>[^:]*))?:(?P<effect>[A-Za-z]+)$")
VOLUME_KINDS = ("pvc", "nfs", "host")


def parse_toleration(text: str) -> tuple[str, str | None, str] | str:
    """``key[=value]:Effect`` -> (key, value or None, effect), or why it is not one."""
    match = TOLERATION.match(text)
    if not match:
        return f"expected key[=value]:Effect (kubectl taint syntax), got {text!r}"
    key, value, effect = match["key"], match["value"], match["effect"]
    if not QUALIFIED.match(key):
        return f"{key!r} is not a Kubernetes label key"
    if value is not None and not LABEL_VALUE.match(value):
        return f"{value!r} is not a Kubernetes label value"
    if effect not in EFFECTS:
        return f"effect must be one of {', '.join(EFFECTS)}, got {effect!r}"
    return key, value, effect


def parse_volume(source: str) -> tuple[str, tuple[str, ...], bool] | str:
    """``pvc:CLAIM``, ``nfs:SERVER:/export``, ``host:/path`` (+ ``:ro``) -> (kind, args,
    read_only), or why it is not one."""
    parts = source.split(":")
    read_only = parts[-1] == "ro"
    if read_only:
        parts = parts[:-1]
    kind, args = parts[0], tuple(parts[1:])
    claim, _ = PATTERNS["dns_subdomain"]
    if kind == "pvc" and len(args) == 1 and claim.match(args[0]):
        return kind, args, read_only
    if kind == "nfs" and len(args) == 2 and args[0] and args[1].startswith("/"):
        return kind, args, read_only
    if kind == "host" and len(args) == 1 and args[0].startswith("/"):
        return kind, args, read_only
    return (
        f"expected pvc:CLAIM, nfs:SERVER:/export or host:/path (optionally ending in :ro), "
        f"got {source!r}"
    )


def _check_volumes(cfg: Config, b: Collector) -> None:
    for mount, source in cfg.kubernetes.volumes.items():
        path = ("kubernetes", "volumes", mount)
        if not mount.startswith("/") or ":" in mount or mount.rstrip("/") == "/dev/shm":
            b.fail(path, "the key must be an absolute mount path (not /dev/shm, no ':')")
            continue
        parsed = parse_volume(source)
        if isinstance(parsed, str):
            b.fail(path, parsed)


def _check_names(cfg: Config, b: Collector) -> None:
    k = cfg.kubernetes
    for key, value in k.node_selector.items():
        if not QUALIFIED.match(key):
            b.fail(("kubernetes", "node_selector", key), "is not a Kubernetes label key")
        elif not LABEL_VALUE.match(value):
            b.fail(("kubernetes", "node_selector", key), f"{value!r} is not a label value")
    for i, text in enumerate(k.tolerations):
        parsed = parse_toleration(text)
        if isinstance(parsed, str):
            b.fail(("kubernetes", "tolerations"), f"entry {i + 1}: {parsed}")
    if "/" not in k.gpu_resource or not QUALIFIED.match(k.gpu_resource):
        b.fail(
            ("kubernetes", "gpu_resource"),
            f"must be an extended resource name such as nvidia.com/gpu, got {k.gpu_resource!r}",
        )
    if not QUALIFIED.match(k.gpu_type_label):
        b.fail(
            ("kubernetes", "gpu_type_label"),
            f"must be a Kubernetes label key such as nvidia.com/gpu.product, got "
            f"{k.gpu_type_label!r}",
        )


def _check_resources(cfg: Config, b: Collector) -> None:
    k = cfg.kubernetes
    quantity, expected = PATTERNS["quantity"]
    for name, value in k.resources.items():
        path = ("kubernetes", "resources", name)
        if not QUALIFIED.match(name):
            b.fail(path, "is not a Kubernetes resource name")
        elif name == k.gpu_resource:
            b.fail(path, "is set by ddlaunch; use nodes.gpus_per_node instead")
        elif not quantity.match(value):
            b.fail(path, f"must be {expected}; got {value!r}")
    for name, value in k.rdma.items():
        path = ("kubernetes", "rdma", name)
        if "/" not in name or not QUALIFIED.match(name):
            b.fail(path, "is not an extended resource name (vendor.example/name)")
        elif not re.match(r"^[1-9][0-9]*$", value):
            b.fail(path, f"must be a positive whole number of devices, got {value!r}")


def check_kubernetes(cfg: Config, b: Collector) -> None:
    k = cfg.kubernetes
    if k.gang == "kueue" and not k.queue:
        b.fail(
            ("kubernetes", "queue"),
            "gang: kueue needs the LocalQueue to submit to (kubernetes.queue)",
            also=("kubernetes", "gang"),
        )
    if k.queue and k.gang != "kueue":
        b.fail(("kubernetes", "gang"), f"kubernetes.queue is set but gang is {k.gang}; use kueue")
    _check_names(cfg, b)
    _check_resources(cfg, b)
    _check_volumes(cfg, b)
