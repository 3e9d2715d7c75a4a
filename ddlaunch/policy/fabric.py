"""Compare what a node really has with its profile (pure, torch-free; for ``ddlaunch doctor``).

The doctor job runs the commands in ``COMMANDS`` on a node and hands their stdout here, keyed
the same way; a command that is missing or failed is passed as ``None``. ``check_node`` turns
that into findings: ``ok``, ``mismatch`` (the node contradicts the profile), ``warning``
(nothing contradicts it, but the config leaves speed on the table) or ``unchecked`` (with the
reason, e.g. the tool is absent). Nothing here runs a command.

The tools' output is parsed by ``ddlaunch.policy.fabric_tools``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ddlaunch.config.schema import Config
from ddlaunch.policy.fabric_tools import (
    GpuTopology,
    Link,
    RdmaDevice,
    RdmaPort,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_ip_link,
    parse_nvidia_smi_topo,
)
from ddlaunch.wording import counted

# The parsers are part of this module's interface (the doctor and the tests use them here).
__all__ = [
    "COMMANDS",
    "FabricFinding",
    "FabricStatus",
    "GpuTopology",
    "Link",
    "RdmaDevice",
    "RdmaPort",
    "check_node",
    "parse_ibstat",
    "parse_ibv_devinfo",
    "parse_ip_link",
    "parse_nvidia_smi_topo",
]

IBV_DEVINFO = "ibv_devinfo"
IBSTAT = "ibstat"
NVIDIA_SMI_TOPO = "nvidia_smi_topo"
IP_LINK = "ip_link"

# What the doctor job should run on a node, under the keys ``check_node`` reads.
COMMANDS: dict[str, tuple[str, ...]] = {
    IBV_DEVINFO: ("ibv_devinfo",),
    IBSTAT: ("ibstat",),
    NVIDIA_SMI_TOPO: ("nvidia-smi", "topo", "-m"),
    IP_LINK: ("ip", "-o", "link"),
}


class FabricStatus(StrEnum):
    OK = "ok"
    MISMATCH = "mismatch"
    UNCHECKED = "unchecked"
    WARNING = "warning"  # nothing contradicts the config, but it leaves speed on the table


# A shipped preset per fabric, named when the nodes have a fabric the config does not declare
# (tests/test_policy_fabric.py checks that each exists and declares that kind).
PRESET_FOR_FABRIC = {
    "ib": "clusters/dgx-h100",
    "roce": "clusters/roce-l40s",
    "efa": "clusters/aws-p5",
}


@dataclass(frozen=True)
class FabricFinding:
    """One comparison: ``check`` names what was compared, ``detail`` says what was found."""

    check: str
    status: FabricStatus
    detail: str


# ---------------------------------------------------------------- comparison

# NCCL's path types from closest to farthest (NCCL docs, NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL).
_PATH_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def _path_rank(value: str) -> int:
    kind = "NV" if value.startswith("NV") else value
    return _PATH_ORDER.index(kind) if kind in _PATH_ORDER else len(_PATH_ORDER)


def _read_devices(outputs: dict[str, str | None]) -> tuple[dict[str, RdmaDevice], str] | None:
    if outputs.get(IBV_DEVINFO):
        return parse_ibv_devinfo(outputs[IBV_DEVINFO] or ""), "ibv_devinfo"
    if outputs.get(IBSTAT):
        return parse_ibstat(outputs[IBSTAT] or ""), "ibstat"
    return None


def _fabric_of(device: RdmaDevice) -> str:
    """The fabric an active device serves, from its active ports' link layer."""
    layers = {p.link_layer for p in device.ports if p.active}
    if "InfiniBand" in layers:
        return "ib"
    if "Ethernet" in layers:
        return "roce"
    return "efa" if device.name.startswith(("efa", "rdmap")) else "ib"


def _undeclared_findings(outputs: dict[str, str | None]) -> list[FabricFinding]:
    """fabric.kind: auto. NCCL picks a transport itself; say what the node offers it."""
    found = _read_devices(outputs)
    if found is None:
        return [
            FabricFinding(
                "fabric.kind",
                FabricStatus.UNCHECKED,
                "fabric.kind is auto and neither ibv_devinfo nor ibstat gave output: whether "
                "the nodes have an RDMA fabric is unknown",
            )
        ]
    devices, tool = found
    active = [d for d in devices.values() if d.active]
    if not active:
        return [
            FabricFinding(
                "fabric.kind",
                FabricStatus.OK,
                f"no active RDMA device ({tool}): NCCL will use TCP sockets (fabric.kind: auto)",
            )
        ]
    kinds = sorted({_fabric_of(d) for d in active})
    kind = kinds[0]
    names = ", ".join(d.name for d in active)
    return [
        FabricFinding(
            "fabric.kind",
            FabricStatus.WARNING,
            f"active RDMA devices {names} ({tool}) but no fabric declared (fabric.kind: auto): "
            f"NCCL chooses by itself, with none of the profile's tuning; declare it, e.g. "
            f"defaults: [{PRESET_FOR_FABRIC[kind]}] or fabric.kind: {kind}",
        )
    ]


def _rdma_findings(cfg: Config, outputs: dict[str, str | None]) -> list[FabricFinding]:
    fab = cfg.fabric
    if fab.kind == "auto":
        return _undeclared_findings(outputs)
    if fab.kind not in ("ib", "roce", "efa"):
        if fab.kind == "slingshot":
            return [
                FabricFinding(
                    "fabric.devices",
                    FabricStatus.UNCHECKED,
                    "Slingshot CXI NICs are not verbs devices; check them with cxi_stat",
                )
            ]
        return []
    found = _read_devices(outputs)
    if found is None:
        return [
            FabricFinding(
                "fabric.devices",
                FabricStatus.UNCHECKED,
                "neither ibv_devinfo nor ibstat gave output (rdma-core / infiniband-diags "
                "not installed, or no RDMA driver loaded)",
            )
        ]
    devices, tool = found
    layer = {"ib": "InfiniBand", "roce": "Ethernet"}.get(fab.kind)
    findings: list[FabricFinding] = []
    wanted = [h.split(":")[0] for h in fab.hcas]
    if not wanted:
        active = [d.name for d in devices.values() if d.active]
        if active:
            return [
                FabricFinding(
                    "fabric.devices", FabricStatus.OK, f"active: {', '.join(active)} ({tool})"
                )
            ]
        return [
            FabricFinding(
                "fabric.devices",
                FabricStatus.MISMATCH,
                f"no active RDMA device for fabric.kind={fab.kind} ({tool} lists "
                f"{', '.join(devices) or 'none'})",
            )
        ]
    for name in wanted:
        check = f"fabric.hca.{name}"
        device = devices.get(name)
        if device is None:
            findings.append(
                FabricFinding(
                    check,
                    FabricStatus.MISMATCH,
                    f"{name} not present ({tool} lists {', '.join(devices) or 'none'})",
                )
            )
        elif not device.active:
            states = ", ".join(f"port {p.number}: {p.state or '?'}" for p in device.ports)
            findings.append(
                FabricFinding(check, FabricStatus.MISMATCH, f"{name} is not ACTIVE ({states})")
            )
        elif layer and not any(p.link_layer == layer for p in device.ports if p.active):
            seen = ", ".join(sorted({p.link_layer or "?" for p in device.ports}))
            findings.append(
                FabricFinding(
                    check,
                    FabricStatus.MISMATCH,
                    f"{name} is active but its link layer is {seen}, not {layer} "
                    f"(fabric.kind={fab.kind})",
                )
            )
        else:
            findings.append(
                FabricFinding(check, FabricStatus.OK, f"{name} present and ACTIVE ({tool})")
            )
    return findings


def _interface_findings(cfg: Config, outputs: dict[str, str | None]) -> list[FabricFinding]:
    interface = cfg.fabric.interface
    if not interface:
        return []
    check = f"fabric.interface.{interface}"
    text = outputs.get(IP_LINK)
    if not text:
        return [
            FabricFinding(
                check, FabricStatus.UNCHECKED, "ip -o link gave no output (iproute2 missing?)"
            )
        ]
    links = parse_ip_link(text)
    link = links.get(interface)
    if link is None:
        similar = sorted(n for n in links if n.startswith(interface))
        hint = (
            f"; only {', '.join(similar)} match it as a prefix (NCCL accepts a prefix, "
            "GLOO_SOCKET_IFNAME needs an exact name)"
            if similar
            else f"; interfaces: {', '.join(sorted(links)) or 'none'}"
        )
        return [
            FabricFinding(check, FabricStatus.MISMATCH, f"no interface named {interface}{hint}")
        ]
    if not link.up:
        flags = ",".join(sorted(link.flags))
        return [
            FabricFinding(
                check,
                FabricStatus.MISMATCH,
                f"{interface} exists but is down (<{flags}>, {link.state})",
            )
        ]
    return [FabricFinding(check, FabricStatus.OK, f"{interface} is up")]


def _gpu_findings(cfg: Config, outputs: dict[str, str | None]) -> list[FabricFinding]:
    text = outputs.get(NVIDIA_SMI_TOPO)
    wanted = cfg.nodes.gpus_per_node
    expected = cfg.cluster.gpus_per_node
    if not text:
        if not wanted and not expected:
            return []
        reason = "nvidia-smi topo -m gave no output (no NVIDIA driver, or not an NVIDIA node)"
        return [
            FabricFinding("topology.gpus", FabricStatus.UNCHECKED, reason),
            FabricFinding("topology.interconnect", FabricStatus.UNCHECKED, reason),
        ]
    topo = parse_nvidia_smi_topo(text)
    count = len(topo.gpus)
    findings: list[FabricFinding] = []
    if count < wanted:
        findings.append(
            FabricFinding(
                "topology.gpus",
                FabricStatus.MISMATCH,
                f"{counted(count, 'GPU')}, but the job asks for {wanted} per node "
                "(nodes.gpus_per_node)",
            )
        )
    elif expected is not None and count != expected:
        findings.append(
            FabricFinding(
                "topology.gpus",
                FabricStatus.MISMATCH,
                f"{counted(count, 'GPU')}, but preset {cfg.cluster.name!r} says {expected} "
                "(cluster.gpus_per_node)",
            )
        )
    else:
        findings.append(FabricFinding("topology.gpus", FabricStatus.OK, counted(count, "GPU")))
    findings.append(_interconnect_finding(cfg, topo))
    findings += _gdr_findings(cfg, topo)
    return findings


def _interconnect_finding(cfg: Config, topo: GpuTopology) -> FabricFinding:
    check, declared = "topology.interconnect", cfg.topology.interconnect
    pairs = topo.pairs()
    if not pairs:
        return FabricFinding(
            check, FabricStatus.UNCHECKED, "fewer than two GPUs: no GPU-GPU links to check"
        )
    nvlinked = [p for p in pairs if p[2].startswith("NV")]
    others = [p for p in pairs if not p[2].startswith("NV")]
    if declared == "nvswitch":
        # nvidia-smi shows NVSwitch as NV<n> between every pair; a full NVLink mesh looks the
        # same, so "every pair over NVLink" is what can be verified.
        if others:
            a, b, how = others[0]
            return FabricFinding(
                check,
                FabricStatus.MISMATCH,
                f"profile says nvswitch but {len(others)} GPU pairs have no NVLink "
                f"(e.g. {a}-{b}: {how}); NVSwitch fabric manager down?",
            )
        kinds = ", ".join(sorted({p[2] for p in nvlinked}))
        return FabricFinding(
            check, FabricStatus.OK, f"every GPU pair is NVLink-connected ({kinds})"
        )
    if declared == "auto":
        kinds = ", ".join(sorted({p[2] for p in pairs}))
        return FabricFinding(
            check,
            FabricStatus.OK,
            f"{len(nvlinked)} of {len(pairs)} GPU pairs are NVLink-connected ({kinds}); "
            "interconnect: auto leaves NCCL_P2P_LEVEL to NCCL",
        )
    if declared == "nvlink":
        if not nvlinked:
            return FabricFinding(
                check,
                FabricStatus.MISMATCH,
                "profile says nvlink but no GPU pair is NVLink-connected (PCIe only)",
            )
        return FabricFinding(
            check,
            FabricStatus.OK,
            f"{len(nvlinked)} of {len(pairs)} GPU pairs are NVLink-connected",
        )
    if nvlinked:
        a, b, how = nvlinked[0]
        return FabricFinding(
            check,
            FabricStatus.MISMATCH,
            f"profile says pcie but {len(nvlinked)} GPU pairs have NVLink (e.g. {a}-{b}: "
            f"{how}); interconnect: {'nvswitch' if not others else 'nvlink'} would use it",
        )
    return FabricFinding(check, FabricStatus.OK, "no NVLink between GPUs, as the pcie profile says")


def _gdr_findings(cfg: Config, topo: GpuTopology) -> list[FabricFinding]:
    """With GPUDirect RDMA at NCCL_NET_GDR_LEVEL=PHB, each GPU needs an HCA within PHB."""
    fab = cfg.fabric
    if fab.kind not in ("ib", "roce") or not fab.gpudirect or not topo.nic_paths:
        return []
    wanted = {h.split(":")[0] for h in fab.hcas}
    far = []
    for gpu in topo.gpus:
        paths = {n: v for n, v in topo.nic_paths.get(gpu, {}).items() if not wanted or n in wanted}
        if not paths:
            continue
        best = min(paths.values(), key=_path_rank)
        if _path_rank(best) > _path_rank("PHB"):
            far.append(f"{gpu} ({best})")
    if far:
        return [
            FabricFinding(
                "fabric.gpudirect",
                FabricStatus.MISMATCH,
                "GPUDirect RDMA (NCCL_NET_GDR_LEVEL=PHB) will not be used for "
                f"{', '.join(far)}: no configured HCA within the same CPU",
            )
        ]
    return [FabricFinding("fabric.gpudirect", FabricStatus.OK, "every GPU has an HCA within PHB")]


def check_node(profile_cfg: Config, outputs: dict[str, str | None]) -> list[FabricFinding]:
    """Compare one node's command outputs (keys of ``COMMANDS``; None = absent) with a profile."""
    return [
        *_rdma_findings(profile_cfg, outputs),
        *_interface_findings(profile_cfg, outputs),
        *_gpu_findings(profile_cfg, outputs),
    ]
