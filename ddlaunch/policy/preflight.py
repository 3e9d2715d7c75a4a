"""Preflight verdicts (pure): node facts + thresholds -> checks -> which nodes to exclude.

A node (``ddlaunch.health.checks``, inside the ranks through ``ddlaunch.worker.gate``)
gathers facts and runs the local checks below; every node's report is then joined, with the
cross-node bandwidth verdicts, and decided on (``evaluate``, ``decide``). ``unchecked`` never
fails a node: it says what could not be checked and why (no nvidia-smi, single node, torch
missing...).

Whose failure is it? A failed check is the node's (its GPUs, its local disk, a task that died
there: excluding the node helps) unless it carries a ``cause``: then it is about something
every node shares (a staging source, the checkpoint filesystem, the Python environment), and
the same ``cause`` on every node of the attempt is the user's or the shared system's, which no
exclusion fixes: the run stops and no node is blamed, even in a job of one node. The same
failure on some nodes only is still theirs (a missing mount of the shared path).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from ddlaunch.wording import counted

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config


class CheckRecord(TypedDict):
    """A check as a node report and ``health/preflight.json`` keep it (``Check.as_dict``)."""

    name: str
    status: str  # a ``CheckStatus``
    detail: str
    cause: NotRequired[str]


class NetReport(TypedDict, total=False):
    """A node report's bandwidth test: what was measured, or why it was not."""

    backend: str
    world: int
    bytes: int
    allreduce_gbps: float
    ring_gbps: float
    join_s: float  # the rendezvous (training's own)
    test_s: float  # the test proper
    skipped: str
    error: str


class NodeReport(TypedDict):
    """One node's preflight report, as the node writes it (``store.preflight``) and its
    readers take it as found. ``facts``: what the checks were made from (``gpus``,
    ``free_gb:<path label>``, ``torch``), as shown; ``inject``: the in-rank gate's own (the
    fault injections for this node), never written."""

    host: str
    index: int
    time: float
    facts: dict[str, object]
    checks: list[CheckRecord]
    net: NotRequired[NetReport]
    elapsed_s: NotRequired[float]
    fabric: NotRequired[list[dict[str, str]]]  # ``ddlaunch doctor``'s fabric findings
    signal: NotRequired[str]  # the pre-timeout signal received while checking
    inject: NotRequired[dict[str, object]]


class VerdictRecord(TypedDict):
    """A node's verdict as ``health/preflight.json`` keeps it (``NodeVerdict.as_dict``)."""

    node: str
    ok: bool
    checks: list[CheckRecord]


class AttemptVerdict(TypedDict):
    """A node's verdict as the attempt record keeps it (``attempt_verdicts``)."""

    node: str
    ok: bool
    reason: NotRequired[str]


class CheckStatus(StrEnum):
    OK = "ok"
    FAIL = "fail"
    WARN = "warn"
    UNCHECKED = "unchecked"


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    detail: str
    # Set on a failure of something every node shares: the failure with no node-specific
    # numbers (free GB, seconds), so that the same cause reads the same on every node.
    cause: str = ""

    def as_dict(self) -> CheckRecord:
        out: CheckRecord = {"name": self.name, "status": str(self.status), "detail": self.detail}
        if self.cause:
            out["cause"] = self.cause
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Check:
        return cls(
            str(d.get("name", "?")),
            CheckStatus(str(d.get("status", "unchecked"))),
            str(d.get("detail", "")),
            str(d.get("cause", "")),
        )


# Floors for the all-reduce bus bandwidth (Gbit/s, nccl-tests' busbw convention), far below
# the nominal rate of each fabric on purpose: preflight must catch a broken or fallen-back
# link (NCCL over TCP on an IB cluster, a port trained at a fraction of its speed), not
# grade a healthy one. gloo moves CPU tensors over TCP sockets whatever the fabric.
NCCL_FLOOR_GBPS = {"ib": 100.0, "roce": 50.0, "efa": 50.0, "slingshot": 50.0, "ethernet": 5.0}
GLOO_FLOOR_GBPS = 0.2


def bandwidth_floor(configured: float | None, backend: str, fabric_kind: str) -> float:
    if configured is not None:
        return configured
    if backend == "nccl":
        return NCCL_FLOOR_GBPS.get(fabric_kind, NCCL_FLOOR_GBPS["ethernet"])
    return GLOO_FLOOR_GBPS


def gpu_check(
    requested: int,
    assigned: int | None,
    smi_count: int | None,
    smi_error: str | None = None,
) -> Check:
    """GPUs visible vs requested. ``assigned``: what Slurm gave the step (CUDA_VISIBLE_DEVICES
    or SLURM_JOB_GPUS); ``smi_count``: what nvidia-smi lists, None when it is absent."""
    if requested == 0:
        return Check("gpus", CheckStatus.OK, "no GPUs requested")
    if smi_error:
        return Check("gpus", CheckStatus.FAIL, f"nvidia-smi failed: {smi_error}")
    if assigned is None and smi_count is None:
        return Check(
            "gpus",
            CheckStatus.FAIL,
            f"requested {counted(requested, 'GPU')}, none assigned by Slurm",
        )
    if assigned is not None and assigned < requested:
        return Check(
            "gpus",
            CheckStatus.FAIL,
            f"Slurm assigned {counted(assigned, 'GPU')}, requested {requested}",
        )
    if smi_count is not None and smi_count < requested:
        return Check(
            "gpus",
            CheckStatus.FAIL,
            f"nvidia-smi lists {counted(smi_count, 'GPU')}, requested {requested}",
        )
    if smi_count is None:
        return Check(
            "gpus",
            CheckStatus.OK,
            f"{assigned} assigned by Slurm (nvidia-smi absent: device health not checked)",
        )
    return Check("gpus", CheckStatus.OK, f"{smi_count} listed by nvidia-smi, {requested} requested")


# The checkpoint directory lies on the filesystem every node shares (the run directory's, or
# storage.checkpoint_dir); scratch is node-local by definition.
SHARED_DISKS = frozenset({"checkpoints"})


def disk_check(
    label: str, path: str, free_gb: float | None, min_free_gb: float, error: str = ""
) -> Check:
    name = f"disk:{label}"
    shared = label in SHARED_DISKS
    if free_gb is None:
        detail = f"{path}: {error or 'cannot stat'}"
        return Check(name, CheckStatus.FAIL, detail, detail if shared else "")
    if free_gb < min_free_gb:
        cause = f"{path}: less free space than {min_free_gb:g} GB (health.min_free_gb)"
        return Check(
            name,
            CheckStatus.FAIL,
            f"{path}: {free_gb:.2f} GB free, needs {min_free_gb:g} (health.min_free_gb)",
            cause if shared else "",
        )
    return Check(name, CheckStatus.OK, f"{path}: {free_gb:.1f} GB free")


def torch_check(version: str | None, error: str | None, seconds: float | None = None) -> Check:
    if error:
        # The ranks' Python environment (launch.python, launch.setup, the image) is the job's:
        # one that cannot import torch on every node is the user's, not the hardware's.
        detail = f"import torch failed: {error}"
        return Check("torch", CheckStatus.FAIL, detail, detail)
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    return Check("torch", CheckStatus.OK, f"torch {version} imported{took}")


def bandwidth_checks(
    ring_gbps: Mapping[str, float | None],
    allreduce_gbps: float | None,
    floor: float,
    order: Sequence[str],
    skipped: str = "",
) -> dict[str, Check]:
    """Per node. Each node timed an exchange with its ring neighbours (send to the next, receive
    from the previous), so one bad node slows three measurements: its own and its two
    neighbours'. A node is blamed only when its own and both neighbours' rates are below the
    floor, and only when that leaves a minority of the nodes: if most are slow, the fabric (or
    the floor) is the problem, not a node, and excluding them would stall the run."""
    if skipped:
        return {n: Check("bandwidth", CheckStatus.UNCHECKED, skipped) for n in order}
    members = [n for n in order if ring_gbps.get(n) is not None]
    if len(members) < 2:
        why = "fewer than two nodes could join the all-reduce test"
        return {n: Check("bandwidth", CheckStatus.UNCHECKED, why) for n in order}
    slow = {n for n in members if (ring_gbps[n] or 0.0) < floor}
    k = len(members)
    blamed = set()
    if k >= 3:
        for i, n in enumerate(members):
            if {n, members[i - 1], members[(i + 1) % k]} <= slow:
                blamed.add(n)
    overall = (
        f"all-reduce {allreduce_gbps:.2f} Gbit/s over {counted(k, 'node')}"
        if allreduce_gbps is not None
        else ""
    )
    out: dict[str, Check] = {}
    minority = 0 < len(blamed) < k / 2
    for n in order:
        rate = ring_gbps.get(n)
        if rate is None:
            out[n] = Check("bandwidth", CheckStatus.UNCHECKED, "did not take part in the test")
            continue
        mine = f"ring exchange {rate:.2f} Gbit/s, floor {floor:g}"
        if n in blamed and minority:
            out[n] = Check(
                "bandwidth", CheckStatus.FAIL, f"{mine}; neighbours fast, this node slow"
            )
        elif n in slow or (not minority and allreduce_gbps is not None and allreduce_gbps < floor):
            out[n] = Check(
                "bandwidth", CheckStatus.WARN, f"{mine}; {overall}; no single node to blame"
            )
        else:
            out[n] = Check("bandwidth", CheckStatus.OK, f"{mine}; {overall}".rstrip("; "))
    return out


@dataclass
class NodeVerdict:
    node: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == CheckStatus.FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    def reason(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.failed)

    def as_dict(self) -> VerdictRecord:
        return {"node": self.node, "ok": self.ok, "checks": [c.as_dict() for c in self.checks]}


def join_reports(
    nodes: Sequence[str],
    reports: Mapping[str, NodeReport],
    floor: float,
) -> list[NodeVerdict]:
    """Every node of the allocation, in order: its local checks, plus bandwidth; a node with
    no report fails (its preflight task died, hung or never started)."""
    ring: dict[str, float | None] = {}
    allreduce: list[float] = []
    skipped = ""
    for n in nodes:
        report = reports.get(n)
        net: NetReport = (report.get("net") if report is not None else None) or {}
        ring[n] = net.get("ring_gbps")
        if (gbps := net.get("allreduce_gbps")) is not None:
            allreduce.append(float(gbps))
        if net.get("skipped") and not skipped and len(nodes) == 1:
            skipped = str(net.get("skipped"))
    if len(nodes) == 1:
        skipped = skipped or "single node: no inter-node test"
    bw = bandwidth_checks(
        ring, statistics.median(allreduce) if allreduce else None, floor, nodes, skipped
    )
    verdicts = []
    for n in nodes:
        report = reports.get(n)
        if report is None:
            verdicts.append(
                NodeVerdict(
                    n,
                    [
                        Check(
                            "report",
                            CheckStatus.FAIL,
                            "no preflight report (task died, hung or timed out)",
                        )
                    ],
                )
            )
            continue
        checks = [Check.from_dict(c) for c in report.get("checks", [])]
        verdicts.append(NodeVerdict(n, [*checks, bw[n]]))
    return verdicts


@dataclass(frozen=True)
class PreflightDecision:
    """``exclude``: nodes to keep out and requeue without; ``stop``: fail the run instead,
    blaming no node: every node failed alike on something they share (``shared_cause``: a
    staging source that does not exist, the checkpoint filesystem, the Python environment;
    in a job of one node too), or every node of a multi-node allocation failed. Otherwise
    the failing nodes are excluded, a single node too."""

    exclude: tuple[str, ...]
    stop: bool
    reason: str


def shared_cause(verdicts: Sequence[NodeVerdict]) -> str | None:
    """The failure every node shares (``name: cause`` of each failed check, the same on each
    node, every one carrying a cause), or None: a failure that differs between nodes, or one
    that is a node's own (no cause), is the nodes'."""
    if not verdicts:
        return None
    seen = set()
    for verdict in verdicts:
        failed = verdict.failed
        if not failed or any(not c.cause for c in failed):
            return None
        seen.add(tuple(f"{c.name}: {c.cause}" for c in failed))
    return "; ".join(seen.pop()) if len(seen) == 1 else None


def decide(verdicts: Sequence[NodeVerdict]) -> PreflightDecision:
    failed = [v for v in verdicts if not v.ok]
    if not failed:
        return PreflightDecision((), False, "every node passed")
    cause = shared_cause(verdicts)
    if cause is not None:
        nodes = ", ".join(v.node for v in verdicts)
        return PreflightDecision(
            (),
            True,
            f"preflight failed alike on every node ({nodes}), which no node's exclusion "
            f"fixes: {cause}",
        )
    why = "; ".join(f"{v.node}: {v.reason()}" for v in failed)
    if len(failed) == len(verdicts) > 1:
        return PreflightDecision((), True, f"preflight failed on every node ({why})")
    return PreflightDecision(tuple(v.node for v in failed), False, f"preflight failed: {why}")


def verdicts_as_dict(verdicts: Sequence[NodeVerdict]) -> list[VerdictRecord]:
    return [v.as_dict() for v in verdicts]


def summary_line(verdicts: Sequence[Mapping[str, Any]]) -> str:
    """``2 ok, 1 failed (node2: disk:checkpoints ...)`` from stored verdicts (for status)."""
    bad = [v for v in verdicts if not v.get("ok", True)]
    text = f"{len(verdicts) - len(bad)} ok"
    if bad:
        reasons = []
        for v in bad:
            failed = [c for c in v.get("checks", []) if c.get("status") == "fail"]
            reasons.append(f"{v.get('node', '?')}: {failed[0]['name'] if failed else '?'}")
        text += f", {len(bad)} failed ({', '.join(reasons)})"
    return text


def evaluate(
    cfg: Config, nodes: Sequence[str], reports: Mapping[str, NodeReport]
) -> list[NodeVerdict]:
    """Every node's verdict from the reports, with the bandwidth floor of the backend the
    reports measured (``health.min_bandwidth_gbps``, else the fabric's default)."""
    backends = [
        str((r.get("net") or {}).get("backend"))
        for r in reports.values()
        if (r.get("net") or {}).get("backend")
    ]
    floor = bandwidth_floor(
        cfg.health.min_bandwidth_gbps, backends[0] if backends else "gloo", cfg.fabric.kind
    )
    return join_reports(nodes, reports, floor)


def attempt_verdicts(results: Sequence[NodeVerdict]) -> list[AttemptVerdict]:
    """The per-node verdicts as the attempt record keeps them."""
    out = []
    for v in results:
        verdict: AttemptVerdict = {"node": v.node, "ok": v.ok}
        if not v.ok:
            verdict["reason"] = v.reason()
        out.append(verdict)
    return out


def as_records(
    results: Sequence[NodeVerdict],
) -> tuple[list[VerdictRecord], list[AttemptVerdict]]:
    """The verdicts as ``health/preflight.json`` keeps them, and as the attempt record does."""
    return verdicts_as_dict(results), attempt_verdicts(results)


def node_report_line(report: NodeReport) -> str:
    """One node's report in one line of the batch log."""
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    net: NetReport = report.get("net", {})
    bw = (
        f"{net['ring_gbps']} Gbit/s ring"
        if "ring_gbps" in net
        else net.get("skipped") or net.get("error", "")
    )
    return (
        f"[ddlaunch preflight {report['host']}] "
        + ("; ".join(f"{c['name']}: {c['detail']}" for c in failed) if failed else "ok")
        + f"; bandwidth: {bw} ({report.get('elapsed_s', '?')} s)"
    )
