"""``policy.fabric``: the doctor's comparison of what the fabric tools report with what the
config expects.

Every sample below is HAND-WRITTEN for these tests, in the format of the real tools
(``ibv_devinfo`` from rdma-core, ``ibstat`` from infiniband-diags, ``nvidia-smi topo -m``,
``ip -o link`` from iproute2); device names, GUIDs and addresses are made up.
"""

from __future__ import annotations

from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.policy.fabric import (
    COMMANDS,
    IBSTAT,
    IBV_DEVINFO,
    IP_LINK,
    NVIDIA_SMI_TOPO,
    FabricFinding,
    FabricStatus,
    check_node,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_ip_link,
    parse_nvidia_smi_topo,
)

# Hand-written sample in the format of `ibv_devinfo`: two IB adapters (mlx5_0 active,
# mlx5_3 with its port down) and one RoCE adapter (Ethernet link layer).
IBV_DEVINFO_SAMPLE = """\
hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tnode_guid:\t\t\t946d:ae03:0012:3450
\tsys_image_guid:\t\t\t946d:ae03:0012:3450
\tvendor_id:\t\t\t0x02c9
\tvendor_part_id:\t\t\t4129
\thw_ver:\t\t\t\t0x0
\tboard_id:\t\t\tMT_0000000838
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tsm_lid:\t\t\t1
\t\t\tport_lid:\t\t27
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tInfiniBand

hca_id:\tmlx5_3
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tnode_guid:\t\t\t946d:ae03:0012:3480
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t4096 (5)
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t65535
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tInfiniBand

hca_id:\tmlx5_bond_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t22.36.1010
\tnode_guid:\t\t\t0c42:a103:0055:6670
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t1024 (3)
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tEthernet
"""

# Hand-written sample in the format of `ibstat`: the same two IB adapters.
IBSTAT_SAMPLE = """\
CA 'mlx5_0'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300123450
\tSystem image GUID: 0x946dae0300123450
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 27
\t\tLMC: 0
\t\tSM lid: 1
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0x946dae0300123450
\t\tLink layer: InfiniBand
CA 'mlx5_3'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300123480
\tSystem image GUID: 0x946dae0300123480
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tRate: 10
\t\tBase lid: 65535
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0x946dae0300123480
\t\tLink layer: InfiniBand
"""

# Hand-written sample in the format of `ip -o link`.
IP_LINK_SAMPLE = """\
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 3c:ec:ef:12:34:56 brd ff:ff:ff:ff:ff:ff
3: ibp26s0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 4092 qdisc mq state UP mode DEFAULT group default qlen 256\\    link/infiniband 00:00:10:29:fe:80:00:00:00:00:00:00:94:6d:ae:03:00:12:34:50 brd 00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff
4: hsn0: <BROADCAST,MULTICAST> mtu 9000 qdisc mq state DOWN mode DEFAULT group default qlen 1000\\    link/ether 02:00:00:00:0a:01 brd ff:ff:ff:ff:ff:ff
5: hsn1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 02:00:00:00:0a:02 brd ff:ff:ff:ff:ff:ff
6: docker0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state DOWN mode DEFAULT group default \\    link/ether 02:42:ac:11:00:01 brd ff:ff:ff:ff:ff:ff
7: veth1a2b3c@if6: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master docker0 state UP mode DEFAULT group default \\    link/ether 8a:1b:2c:3d:4e:5f brd ff:ff:ff:ff:ff:ff link-netnsid 0
"""  # noqa: E501 - one interface a line, as ip -o prints

# Hand-written sample in the format of `nvidia-smi topo -m` on an 8-GPU NVSwitch node with
# four adapters (cells are tab-separated, as nvidia-smi prints them).
_NV8_ROWS = [
    ("GPU0", ["X"] + ["NV18"] * 7, ["PXB", "SYS", "SYS", "SYS"], "0-55,112-167", "0"),
    ("GPU1", ["NV18", "X"] + ["NV18"] * 6, ["PXB", "SYS", "SYS", "SYS"], "0-55,112-167", "0"),
    (
        "GPU2",
        ["NV18"] * 2 + ["X"] + ["NV18"] * 5,
        ["SYS", "PXB", "SYS", "SYS"],
        "0-55,112-167",
        "0",
    ),
    (
        "GPU3",
        ["NV18"] * 3 + ["X"] + ["NV18"] * 4,
        ["SYS", "PXB", "SYS", "SYS"],
        "0-55,112-167",
        "0",
    ),
    (
        "GPU4",
        ["NV18"] * 4 + ["X"] + ["NV18"] * 3,
        ["SYS", "SYS", "PXB", "SYS"],
        "56-111,168-223",
        "1",
    ),
    (
        "GPU5",
        ["NV18"] * 5 + ["X"] + ["NV18"] * 2,
        ["SYS", "SYS", "PXB", "SYS"],
        "56-111,168-223",
        "1",
    ),
    ("GPU6", ["NV18"] * 6 + ["X"] + ["NV18"], ["SYS", "SYS", "SYS", "PXB"], "56-111,168-223", "1"),
    ("GPU7", ["NV18"] * 7 + ["X"], ["SYS", "SYS", "SYS", "PXB"], "56-111,168-223", "1"),
]


def _topo_text(rows: list[tuple[str, list[str], list[str], str, str]], nics: list[str]) -> str:
    gpus = [r[0] for r in rows]
    nic_cols = [f"NIC{i}" for i in range(len(nics))]
    header = "\t" + "\t".join(gpus + nic_cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    lines = [header]
    for name, gpu_cells, nic_cells, cpus, numa in rows:
        cells = [f" {c} " if c == "X" else c for c in gpu_cells + nic_cells]
        lines.append("\t".join([name, *cells, cpus, numa, "N/A"]))
    for i, _ in enumerate(nics):
        cells = [rows[g][2][i] for g in range(len(rows))] + [
            " X " if j == i else "SYS" for j in range(len(nics))
        ]
        lines.append("\t".join([f"NIC{i}", *cells]))
    lines += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
        "nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host "
        "Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
        "Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
        "",
        "NIC Legend:",
        "",
        *[f"  NIC{i}: {name}" for i, name in enumerate(nics)],
        "",
    ]
    return "\n".join(lines)


TOPO_NVSWITCH = _topo_text(_NV8_ROWS, ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5"])

# The same node with its NVSwitch fabric down: GPU pairs fall back to PCIe / SMP paths.
_BROKEN = [
    (
        n,
        ["X" if c == "X" else ("NODE" if (i < 4) == (j < 4) else "SYS") for j, c in enumerate(g)],
        nic,
        cpu,
        nu,
    )
    for i, (n, g, nic, cpu, nu) in enumerate(_NV8_ROWS)
]
TOPO_NVSWITCH_DOWN = _topo_text(_BROKEN, ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5"])

# Hand-written sample: a 4-GPU PCIe workstation, two GPUs a PCIe switch, no NICs.
TOPO_PCIE = _topo_text(
    [
        ("GPU0", ["X", "PIX", "SYS", "SYS"], [], "0-31", "0"),
        ("GPU1", ["PIX", "X", "SYS", "SYS"], [], "0-31", "0"),
        ("GPU2", ["SYS", "SYS", "X", "PIX"], [], "0-31", "0"),
        ("GPU3", ["SYS", "SYS", "PIX", "X"], [], "0-31", "0"),
    ],
    [],
)

# Hand-written sample: 4 GPUs bridged by NVLink in pairs (0-1, 2-3).
TOPO_NVLINK_PAIRS = _topo_text(
    [
        ("GPU0", ["X", "NV4", "SYS", "SYS"], [], "0-31", "0"),
        ("GPU1", ["NV4", "X", "SYS", "SYS"], [], "0-31", "0"),
        ("GPU2", ["SYS", "SYS", "X", "NV4"], [], "0-31", "0"),
        ("GPU3", ["SYS", "SYS", "NV4", "X"], [], "0-31", "0"),
    ],
    [],
)


def profile(name: str, *overrides: str) -> Config:
    return validate_tree(load_tree(name, ["launch.entrypoint=m:f", *overrides]))


def by_check(findings: list[FabricFinding]) -> dict[str, FabricFinding]:
    return {f.check: f for f in findings}


# ---------------------------------------------------------------- parsers


def test_parse_ibv_devinfo() -> None:
    devices = parse_ibv_devinfo(IBV_DEVINFO_SAMPLE)
    assert list(devices) == ["mlx5_0", "mlx5_3", "mlx5_bond_0"]
    assert devices["mlx5_0"].active and devices["mlx5_0"].ports[0].link_layer == "InfiniBand"
    assert not devices["mlx5_3"].active and devices["mlx5_3"].ports[0].state == "PORT_DOWN (1)"
    assert devices["mlx5_bond_0"].ports[0].link_layer == "Ethernet"


def test_parse_ibstat() -> None:
    devices = parse_ibstat(IBSTAT_SAMPLE)
    assert list(devices) == ["mlx5_0", "mlx5_3"]
    assert devices["mlx5_0"].active and devices["mlx5_0"].ports[0].link_layer == "InfiniBand"
    assert not devices["mlx5_3"].active and devices["mlx5_3"].ports[0].state == "Down"


def test_parse_ip_link() -> None:
    links = parse_ip_link(IP_LINK_SAMPLE)
    assert set(links) == {"lo", "eth0", "ibp26s0", "hsn0", "hsn1", "docker0", "veth1a2b3c"}
    assert links["eth0"].up and links["eth0"].kind == "ether"
    assert links["ibp26s0"].kind == "infiniband"
    assert not links["hsn0"].up and links["hsn0"].state == "DOWN"
    assert not links["docker0"].up  # UP but NO-CARRIER: no LOWER_UP
    assert links["lo"].up  # state UNKNOWN is normal for loopback


def test_parse_nvidia_smi_topo() -> None:
    topo = parse_nvidia_smi_topo(TOPO_NVSWITCH)
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.links[("GPU0", "GPU7")] == "NV18"
    assert topo.links[("GPU3", "GPU3")] == "X"
    assert topo.nic_paths["GPU0"] == {
        "mlx5_0": "PXB",
        "mlx5_3": "SYS",
        "mlx5_4": "SYS",
        "mlx5_5": "SYS",
    }
    assert len(topo.pairs()) == 28


def test_parse_nvidia_smi_topo_tolerates_color_codes() -> None:
    colored = TOPO_PCIE.replace("GPU0\tGPU1", "\x1b[4mGPU0\tGPU1").replace(
        "NUMA ID", "NUMA ID\x1b[0m"
    )
    assert parse_nvidia_smi_topo(colored).gpus == ("GPU0", "GPU1", "GPU2", "GPU3")


# ---------------------------------------------------------------- check_node


def test_dgx_profile_on_a_healthy_node() -> None:
    cfg = profile("clusters/dgx-h100", "fabric.hcas=[mlx5_0]", "nodes.gpus_per_node=8")
    devinfo = IBV_DEVINFO_SAMPLE
    findings = by_check(
        check_node(cfg, {IBV_DEVINFO: devinfo, NVIDIA_SMI_TOPO: TOPO_NVSWITCH, IP_LINK: None})
    )
    assert findings["fabric.hca.mlx5_0"].status is FabricStatus.OK
    assert findings["topology.gpus"].status is FabricStatus.OK
    assert findings["topology.interconnect"].status is FabricStatus.OK
    assert "NV18" in findings["topology.interconnect"].detail
    # GPU2..7's closest configured HCA (only mlx5_0 here) is across the SMP link.
    assert findings["fabric.gpudirect"].status is FabricStatus.MISMATCH
    assert "GPU2 (SYS)" in findings["fabric.gpudirect"].detail


def test_gpudirect_ok_when_every_gpu_has_a_near_hca() -> None:
    cfg = profile("clusters/dgx-h100", "fabric.hcas=[mlx5_0, mlx5_3, mlx5_4, mlx5_5]")
    findings = by_check(check_node(cfg, {NVIDIA_SMI_TOPO: TOPO_NVSWITCH}))
    assert findings["fabric.gpudirect"].status is FabricStatus.OK


def test_missing_and_down_hcas_are_mismatches() -> None:
    cfg = profile("clusters/dgx-h100")  # 8 compute adapters
    findings = by_check(check_node(cfg, {IBV_DEVINFO: IBV_DEVINFO_SAMPLE}))
    assert findings["fabric.hca.mlx5_0"].status is FabricStatus.OK
    down = findings["fabric.hca.mlx5_3"]
    assert (
        down.status is FabricStatus.MISMATCH and "not ACTIVE (port 1: PORT_DOWN (1))" in down.detail
    )
    missing = findings["fabric.hca.mlx5_4"]
    assert missing.status is FabricStatus.MISMATCH and "mlx5_4 not present" in missing.detail


def test_ibstat_is_used_when_ibv_devinfo_is_absent() -> None:
    cfg = profile("clusters/dgx-h100", "fabric.hcas=[mlx5_0, mlx5_3]")
    findings = by_check(check_node(cfg, {IBV_DEVINFO: None, IBSTAT: IBSTAT_SAMPLE}))
    assert findings["fabric.hca.mlx5_0"].status is FabricStatus.OK
    assert "(ibstat)" in findings["fabric.hca.mlx5_0"].detail
    assert findings["fabric.hca.mlx5_3"].status is FabricStatus.MISMATCH


def test_roce_profile_wants_ethernet_link_layer() -> None:
    cfg = profile("clusters/roce-l40s", "fabric.hcas=[mlx5_0, mlx5_bond_0]")
    findings = by_check(check_node(cfg, {IBV_DEVINFO: IBV_DEVINFO_SAMPLE}))
    wrong = findings["fabric.hca.mlx5_0"]
    assert (
        wrong.status is FabricStatus.MISMATCH
        and "link layer is InfiniBand, not Ethernet" in wrong.detail
    )
    assert findings["fabric.hca.mlx5_bond_0"].status is FabricStatus.OK


def test_absent_tools_are_unchecked_with_reason() -> None:
    cfg = profile("clusters/dgx-h100", "nodes.gpus_per_node=8", "fabric.interface=eth0")
    findings = check_node(cfg, {key: None for key in COMMANDS})
    assert {f.status for f in findings} == {FabricStatus.UNCHECKED}
    reasons = {f.check: f.detail for f in findings}
    assert "neither ibv_devinfo nor ibstat" in reasons["fabric.devices"]
    assert "ip -o link gave no output" in reasons["fabric.interface.eth0"]
    assert "nvidia-smi topo -m gave no output" in reasons["topology.gpus"]


def test_efa_without_named_devices_needs_one_active() -> None:
    cfg = profile("clusters/aws-p5")
    active = check_node(cfg, {IBV_DEVINFO: IBV_DEVINFO_SAMPLE})
    assert active[0].status is FabricStatus.OK and "mlx5_0" in active[0].detail
    dead = IBV_DEVINFO_SAMPLE.replace("PORT_ACTIVE (4)", "PORT_DOWN (1)")
    assert check_node(cfg, {IBV_DEVINFO: dead})[0].status is FabricStatus.MISMATCH


def test_interface_checks() -> None:
    up = by_check(check_node(profile("clusters/devcluster"), {IP_LINK: IP_LINK_SAMPLE}))
    assert up["fabric.interface.eth0"].status is FabricStatus.OK
    down = by_check(check_node(profile("clusters/perlmutter-gpu"), {IP_LINK: IP_LINK_SAMPLE}))
    assert down["fabric.interface.hsn0"].status is FabricStatus.MISMATCH
    assert "exists but is down" in down["fabric.interface.hsn0"].detail
    # A prefix that NCCL would accept but gloo would not.
    prefix = by_check(
        check_node(
            profile("clusters/perlmutter-gpu", "fabric.interface=hsn"), {IP_LINK: IP_LINK_SAMPLE}
        )
    )
    assert prefix["fabric.interface.hsn"].status is FabricStatus.MISMATCH
    assert "only hsn0, hsn1 match it as a prefix" in prefix["fabric.interface.hsn"].detail
    absent = by_check(
        check_node(
            profile("clusters/devcluster", "fabric.interface=ens5"), {IP_LINK: IP_LINK_SAMPLE}
        )
    )
    assert (
        "no interface named ens5; interfaces: docker0, eth0"
        in absent["fabric.interface.ens5"].detail
    )


def test_slingshot_devices_are_unchecked_by_verbs_tools() -> None:
    findings = by_check(check_node(profile("clusters/perlmutter-gpu"), {}))
    assert findings["fabric.devices"].status is FabricStatus.UNCHECKED
    assert "cxi_stat" in findings["fabric.devices"].detail


def test_nvswitch_profile_on_node_with_nvlink_down() -> None:
    cfg = profile("clusters/dgx-h100", "nodes.gpus_per_node=8")
    finding = by_check(check_node(cfg, {NVIDIA_SMI_TOPO: TOPO_NVSWITCH_DOWN}))[
        "topology.interconnect"
    ]
    assert finding.status is FabricStatus.MISMATCH
    assert "28 GPU pairs have no NVLink (e.g. GPU0-GPU1: NODE)" in finding.detail


def test_gpu_count_against_job_and_preset() -> None:
    fewer = by_check(
        check_node(
            profile("clusters/dgx-h100", "nodes.gpus_per_node=8"), {NVIDIA_SMI_TOPO: TOPO_PCIE}
        )
    )
    assert fewer["topology.gpus"].status is FabricStatus.MISMATCH
    assert "4 GPUs, but the job asks for 8" in fewer["topology.gpus"].detail
    other = by_check(
        check_node(
            profile("clusters/dgx-h100", "nodes.gpus_per_node=4"), {NVIDIA_SMI_TOPO: TOPO_PCIE}
        )
    )
    assert "preset 'dgx-h100' says 8" in other["topology.gpus"].detail


def test_interconnect_classification() -> None:
    def verdict(preset: str, topo: str) -> FabricFinding:
        return by_check(check_node(profile(preset), {NVIDIA_SMI_TOPO: topo}))[
            "topology.interconnect"
        ]

    assert verdict("clusters/workstation", TOPO_PCIE).status is FabricStatus.OK
    pcie_on_nvlink = verdict("clusters/workstation", TOPO_NVLINK_PAIRS)
    assert (
        pcie_on_nvlink.status is FabricStatus.MISMATCH
        and "interconnect: nvlink" in pcie_on_nvlink.detail
    )
    pcie_on_switch = verdict("clusters/workstation", TOPO_NVSWITCH)
    assert "interconnect: nvswitch" in pcie_on_switch.detail
    nvlink = verdict("clusters/perlmutter-gpu", TOPO_NVLINK_PAIRS)
    assert nvlink.status is FabricStatus.OK and "2 of 6 GPU pairs" in nvlink.detail
    assert verdict("clusters/perlmutter-gpu", TOPO_PCIE).status is FabricStatus.MISMATCH
    assert verdict("clusters/aws-p5", TOPO_NVLINK_PAIRS).status is FabricStatus.MISMATCH


# ---------------------------------------------------------------- fabric.kind: auto (the default)

IB_ONLY_SAMPLE = IBV_DEVINFO_SAMPLE.split("hca_id:\tmlx5_bond_0")[0]


def test_undeclared_fabric_on_an_infiniband_node_warns_and_names_the_preset() -> None:
    cfg = profile("examples/mlp", "fabric.kind=auto", "fabric.interface=null")
    findings = by_check(check_node(cfg, {IBV_DEVINFO: IB_ONLY_SAMPLE}))
    assert findings["fabric.kind"] == FabricFinding(
        "fabric.kind",
        FabricStatus.WARNING,
        "active RDMA devices mlx5_0 (ibv_devinfo) but no fabric declared (fabric.kind: auto): "
        "NCCL chooses by itself, with none of the profile's tuning; declare it, e.g. "
        "defaults: [clusters/dgx-h100] or fabric.kind: ib",
    )


def test_undeclared_fabric_on_a_roce_node_names_the_roce_preset() -> None:
    roce = "hca_id:\tmlx5_bond_0" + IBV_DEVINFO_SAMPLE.split("hca_id:\tmlx5_bond_0")[1]
    cfg = profile("examples/mlp", "fabric.kind=auto")
    detail = by_check(check_node(cfg, {IBV_DEVINFO: roce}))["fabric.kind"].detail
    assert detail.endswith("defaults: [clusters/roce-l40s] or fabric.kind: roce")


def test_undeclared_fabric_without_rdma_is_ok_and_without_tools_unchecked() -> None:
    cfg = profile("examples/mlp", "fabric.kind=auto")
    down = IBV_DEVINFO_SAMPLE.replace("PORT_ACTIVE (4)", "PORT_DOWN (1)")
    assert by_check(check_node(cfg, {IBV_DEVINFO: down}))["fabric.kind"] == FabricFinding(
        "fabric.kind",
        FabricStatus.OK,
        "no active RDMA device (ibv_devinfo): NCCL will use TCP sockets (fabric.kind: auto)",
    )
    unknown = by_check(check_node(cfg, {IBV_DEVINFO: None, IBSTAT: None}))["fabric.kind"]
    assert unknown.status is FabricStatus.UNCHECKED and "is unknown" in unknown.detail


def test_named_presets_exist_and_declare_that_fabric() -> None:
    from ddlaunch.policy.fabric import PRESET_FOR_FABRIC

    for kind, preset in PRESET_FOR_FABRIC.items():
        assert profile(preset, "launch.entrypoint=m:f").fabric.kind == kind


def test_auto_interconnect_reports_the_links_it_found() -> None:
    cfg = profile("clusters/dgx-h100", "launch.entrypoint=m:f", "topology.interconnect=auto")
    finding = by_check(check_node(cfg, {NVIDIA_SMI_TOPO: TOPO_PCIE}))["topology.interconnect"]
    assert finding.status is FabricStatus.OK
    assert finding.detail.startswith("0 of ") and "leaves NCCL_P2P_LEVEL to NCCL" in finding.detail
