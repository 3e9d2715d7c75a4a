"""Compare what a node really has with its profile (pure, torch-free; for ``ddlaunch doctor``).

The doctor job runs the commands in ``COMMANDS`` on a node and hands their stdout here, keyed
the same way; a command that is missing or failed is passed as ``None``. ``check_node`` turns
that into findings: ``ok``, ``mismatch`` (the node contradicts the profile) or ``unchecked``
(with the reason, e.g. the tool is absent). Nothing here runs a command.

Parsed formats: ``ibv_devinfo`` (rdma-core), ``ibstat`` (infiniband-diags), ``nvidia-smi topo
-m`` and ``ip -o link`` (iproute2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from ddlaunch.config.schema import Config

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


class Status(StrEnum):
    OK = "ok"
    MISMATCH = "mismatch"
    UNCHECKED = "unchecked"


@dataclass(frozen=True)
class Finding:
    """One comparison: ``check`` names what was compared, ``detail`` says what was found."""

    check: str
    status: Status
    detail: str


# ---------------------------------------------------------------- RDMA devices


@dataclass(frozen=True)
class RdmaPort:
    number: int
    active: bool
    state: str
    link_layer: str  # InfiniBand, Ethernet (RoCE), Unspecified (EFA) or "" when not shown


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    ports: tuple[RdmaPort, ...] = ()

    @property
    def active(self) -> bool:
        return any(p.active for p in self.ports)


def parse_ibv_devinfo(text: str) -> dict[str, RdmaDevice]:
    """``ibv_devinfo`` output -> devices by name (``hca_id``), with their ports' states."""
    blocks: list[tuple[str, list[dict[str, str]]]] = []  # (device, its ports' fields)
    ports: list[dict[str, str]] = []

    for raw in text.splitlines():
        line = raw.strip()
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            ports = []
            blocks.append((value, ports))
        elif key == "port" and blocks:
            ports.append({"number": value})
        elif ports and key in ("state", "link_layer"):
            ports[-1][key] = value
    return _devices(blocks)


def _devices(blocks: list[tuple[str, list[dict[str, str]]]]) -> dict[str, RdmaDevice]:
    return {name: RdmaDevice(name, tuple(_port(p) for p in ports)) for name, ports in blocks}


def _port(fields: dict[str, str]) -> RdmaPort:
    state = fields.get("state", "")
    return RdmaPort(
        number=int(fields.get("number", "1") or 1),
        # "PORT_ACTIVE (4)" in ibv_devinfo, "Active" in ibstat.
        active=state.upper().startswith(("PORT_ACTIVE", "ACTIVE")),
        state=state,
        link_layer=fields.get("link_layer", ""),
    )


def parse_ibstat(text: str) -> dict[str, RdmaDevice]:
    """``ibstat`` output -> devices by name (``CA 'mlx5_0'``), with their ports' states."""
    blocks: list[tuple[str, list[dict[str, str]]]] = []  # (device, its ports' fields)
    ports: list[dict[str, str]] = []

    for raw in text.splitlines():
        line = raw.strip()
        ca = re.match(r"^CA '([^']+)'", line)
        if ca:
            ports = []
            blocks.append((ca.group(1), ports))
            continue
        port = re.match(r"^Port (\d+):$", line)
        if port and blocks:
            ports.append({"number": port.group(1)})
            continue
        key, sep, value = line.partition(":")
        if sep and ports:
            key = key.strip().lower()
            if key == "state":
                ports[-1]["state"] = value.strip()
            elif key == "link layer":
                ports[-1]["link_layer"] = value.strip()
    return _devices(blocks)


# ---------------------------------------------------------------- network interfaces


@dataclass(frozen=True)
class Link:
    name: str
    flags: frozenset[str]
    state: str  # UP, DOWN, UNKNOWN (loopback, some virtual and HSN devices)
    kind: str  # ether, infiniband, loopback, ...

    @property
    def up(self) -> bool:
        # LOWER_UP = carrier present; state UNKNOWN is normal for some drivers.
        return "UP" in self.flags and "LOWER_UP" in self.flags and self.state != "DOWN"


_IP_LINK_LINE = re.compile(
    r"^\d+:\s+(?P<name>[^:@\s]+)(?:@[^:\s]+)?:\s+<(?P<flags>[^>]*)>(?P<rest>.*)$"
)


def parse_ip_link(text: str) -> dict[str, Link]:
    """``ip -o link`` output (one interface a line) -> interfaces by name."""
    links: dict[str, Link] = {}
    for line in text.splitlines():
        match = _IP_LINK_LINE.match(line.strip())
        if not match:
            continue
        rest = match.group("rest")
        state = re.search(r"\bstate (\S+)", rest)
        kind = re.search(r"link/(\S+)", rest)
        name = match.group("name")
        links[name] = Link(
            name=name,
            flags=frozenset(f for f in match.group("flags").split(",") if f),
            state=state.group(1) if state else "UNKNOWN",
            kind=kind.group(1) if kind else "",
        )
    return links


# ---------------------------------------------------------------- GPU topology


@dataclass(frozen=True)
class GpuTopology:
    gpus: tuple[str, ...]
    # (GPU a, GPU b) -> connection: X, NV<n>, PIX, PXB, PHB, NODE, SYS
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    # GPU -> {NIC device name: connection}, from the NIC legend (NIC0: mlx5_0)
    nic_paths: dict[str, dict[str, str]] = field(default_factory=dict)

    def pairs(self) -> list[tuple[str, str, str]]:
        out = []
        for i, a in enumerate(self.gpus):
            for b in self.gpus[i + 1 :]:
                out.append((a, b, self.links.get((a, b), "?")))
        return out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_nvidia_smi_topo(text: str) -> GpuTopology:
    """``nvidia-smi topo -m`` -> GPUs, GPU-GPU connections and GPU-NIC paths."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header: list[str] = []
    rows: dict[str, list[str]] = {}
    nic_names: dict[str, str] = {}
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if not header and "GPU0" in cells:
            header = [c for c in cells if c]
            continue
        legend = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)
            continue
        if header and cells and re.match(r"^(GPU|NIC)\d+$", cells[0]):
            rows[cells[0]] = cells[1:]
    columns = [h for h in header if re.match(r"^(GPU|NIC)\d+$", h)]
    gpus = tuple(c for c in columns if c.startswith("GPU"))
    links: dict[tuple[str, str], str] = {}
    nic_paths: dict[str, dict[str, str]] = {}
    for gpu in gpus:
        values = rows.get(gpu, [])
        for column, value in zip(columns, values, strict=False):
            if column.startswith("GPU"):
                links[(gpu, column)] = value
            else:
                nic_paths.setdefault(gpu, {})[nic_names.get(column, column)] = value
    return GpuTopology(gpus=gpus, links=links, nic_paths=nic_paths)


# ---------------------------------------------------------------- comparison

# NCCL's path types from closest to farthest (NCCL docs, NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL).
_PATH_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def _path_rank(value: str) -> int:
    kind = "NV" if value.startswith("NV") else value
    return _PATH_ORDER.index(kind) if kind in _PATH_ORDER else len(_PATH_ORDER)


def _rdma_findings(cfg: Config, outputs: dict[str, str | None]) -> list[Finding]:
    fab = cfg.fabric
    if fab.kind not in ("ib", "roce", "efa"):
        if fab.kind == "slingshot":
            return [
                Finding(
                    "fabric.devices",
                    Status.UNCHECKED,
                    "Slingshot CXI NICs are not verbs devices; check them with cxi_stat",
                )
            ]
        return []
    if outputs.get(IBV_DEVINFO):
        devices, tool = parse_ibv_devinfo(outputs[IBV_DEVINFO] or ""), "ibv_devinfo"
    elif outputs.get(IBSTAT):
        devices, tool = parse_ibstat(outputs[IBSTAT] or ""), "ibstat"
    else:
        return [
            Finding(
                "fabric.devices",
                Status.UNCHECKED,
                "neither ibv_devinfo nor ibstat gave output (rdma-core / infiniband-diags "
                "not installed, or no RDMA driver loaded)",
            )
        ]
    layer = {"ib": "InfiniBand", "roce": "Ethernet"}.get(fab.kind)
    findings: list[Finding] = []
    wanted = [h.split(":")[0] for h in fab.hcas]
    if not wanted:
        active = [d.name for d in devices.values() if d.active]
        if active:
            return [Finding("fabric.devices", Status.OK, f"active: {', '.join(active)} ({tool})")]
        return [
            Finding(
                "fabric.devices",
                Status.MISMATCH,
                f"no active RDMA device for fabric.kind={fab.kind} ({tool} lists "
                f"{', '.join(devices) or 'none'})",
            )
        ]
    for name in wanted:
        check = f"fabric.hca.{name}"
        device = devices.get(name)
        if device is None:
            findings.append(
                Finding(
                    check,
                    Status.MISMATCH,
                    f"{name} not present ({tool} lists {', '.join(devices) or 'none'})",
                )
            )
        elif not device.active:
            states = ", ".join(f"port {p.number}: {p.state or '?'}" for p in device.ports)
            findings.append(Finding(check, Status.MISMATCH, f"{name} is not ACTIVE ({states})"))
        elif layer and not any(p.link_layer == layer for p in device.ports if p.active):
            seen = ", ".join(sorted({p.link_layer or "?" for p in device.ports}))
            findings.append(
                Finding(
                    check,
                    Status.MISMATCH,
                    f"{name} is active but its link layer is {seen}, not {layer} "
                    f"(fabric.kind={fab.kind})",
                )
            )
        else:
            findings.append(Finding(check, Status.OK, f"{name} present and ACTIVE ({tool})"))
    return findings


def _interface_findings(cfg: Config, outputs: dict[str, str | None]) -> list[Finding]:
    interface = cfg.fabric.interface
    if not interface:
        return []
    check = f"fabric.interface.{interface}"
    text = outputs.get(IP_LINK)
    if not text:
        return [Finding(check, Status.UNCHECKED, "ip -o link gave no output (iproute2 missing?)")]
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
        return [Finding(check, Status.MISMATCH, f"no interface named {interface}{hint}")]
    if not link.up:
        flags = ",".join(sorted(link.flags))
        return [
            Finding(
                check, Status.MISMATCH, f"{interface} exists but is down (<{flags}>, {link.state})"
            )
        ]
    return [Finding(check, Status.OK, f"{interface} is up")]


def _gpu_findings(cfg: Config, outputs: dict[str, str | None]) -> list[Finding]:
    text = outputs.get(NVIDIA_SMI_TOPO)
    wanted = cfg.nodes.gpus_per_node
    expected = cfg.cluster.gpus_per_node
    if not text:
        if not wanted and not expected:
            return []
        reason = "nvidia-smi topo -m gave no output (no NVIDIA driver, or not an NVIDIA node)"
        return [
            Finding("topology.gpus", Status.UNCHECKED, reason),
            Finding("topology.interconnect", Status.UNCHECKED, reason),
        ]
    topo = parse_nvidia_smi_topo(text)
    count = len(topo.gpus)
    findings: list[Finding] = []
    if count < wanted:
        findings.append(
            Finding(
                "topology.gpus",
                Status.MISMATCH,
                f"{count} GPUs, but the job asks for {wanted} per node (nodes.gpus_per_node)",
            )
        )
    elif expected is not None and count != expected:
        findings.append(
            Finding(
                "topology.gpus",
                Status.MISMATCH,
                f"{count} GPUs, but preset {cfg.cluster.name!r} says {expected} "
                "(cluster.gpus_per_node)",
            )
        )
    else:
        findings.append(Finding("topology.gpus", Status.OK, f"{count} GPUs"))
    findings.append(_interconnect_finding(cfg, topo))
    findings += _gdr_findings(cfg, topo)
    return findings


def _interconnect_finding(cfg: Config, topo: GpuTopology) -> Finding:
    check, declared = "topology.interconnect", cfg.topology.interconnect
    pairs = topo.pairs()
    if not pairs:
        return Finding(check, Status.UNCHECKED, "fewer than two GPUs: no GPU-GPU links to check")
    nvlinked = [p for p in pairs if p[2].startswith("NV")]
    others = [p for p in pairs if not p[2].startswith("NV")]
    if declared == "nvswitch":
        # nvidia-smi shows NVSwitch as NV<n> between every pair; a full NVLink mesh looks the
        # same, so "every pair over NVLink" is what can be verified.
        if others:
            a, b, how = others[0]
            return Finding(
                check,
                Status.MISMATCH,
                f"profile says nvswitch but {len(others)} GPU pairs have no NVLink "
                f"(e.g. {a}-{b}: {how}); NVSwitch fabric manager down?",
            )
        kinds = ", ".join(sorted({p[2] for p in nvlinked}))
        return Finding(check, Status.OK, f"every GPU pair is NVLink-connected ({kinds})")
    if declared == "nvlink":
        if not nvlinked:
            return Finding(
                check,
                Status.MISMATCH,
                "profile says nvlink but no GPU pair is NVLink-connected (PCIe only)",
            )
        return Finding(
            check, Status.OK, f"{len(nvlinked)} of {len(pairs)} GPU pairs are NVLink-connected"
        )
    if nvlinked:
        a, b, how = nvlinked[0]
        return Finding(
            check,
            Status.MISMATCH,
            f"profile says pcie but {len(nvlinked)} GPU pairs have NVLink (e.g. {a}-{b}: "
            f"{how}); interconnect: {'nvswitch' if not others else 'nvlink'} would use it",
        )
    return Finding(check, Status.OK, "no NVLink between GPUs, as the pcie profile says")


def _gdr_findings(cfg: Config, topo: GpuTopology) -> list[Finding]:
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
            Finding(
                "fabric.gpudirect",
                Status.MISMATCH,
                "GPUDirect RDMA (NCCL_NET_GDR_LEVEL=PHB) will not be used for "
                f"{', '.join(far)}: no configured HCA within the same CPU",
            )
        ]
    return [Finding("fabric.gpudirect", Status.OK, "every GPU has an HCA within PHB")]


def check_node(profile_cfg: Config, outputs: dict[str, str | None]) -> list[Finding]:
    """Compare one node's command outputs (keys of ``COMMANDS``; None = absent) with a profile."""
    return [
        *_rdma_findings(profile_cfg, outputs),
        *_interface_findings(profile_cfg, outputs),
        *_gpu_findings(profile_cfg, outputs),
    ]
