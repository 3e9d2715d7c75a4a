"""Parsers of the node tools' output that ``ddlaunch doctor`` compares with a profile (pure).

Parsed formats: ``ibv_devinfo`` (rdma-core), ``ibstat`` (infiniband-diags), ``nvidia-smi topo
-m`` and ``ip -o link`` (iproute2). ``ddlaunch.policy.fabric`` holds the comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
