"""The preflight gate: ``health.preflight`` inside the training ranks, before the first step.

Why in the ranks and not in a separate srun step before them: that step started Python and
imported torch on every node a second time and built a process group of its own, 3-16 s per
attempt on the dev cluster. The ranks import torch and join a process group anyway, so here
the checks cost a few collectives on the group training then uses.

Every rank, called by ``run_rank`` in this order:

1. ``node_phase`` (torch-free): local rank 0 of each node checks GPUs and free space and
   writes its node report to ``health/preflight/<job>-<restart>/<host>.json`` at once (the
   format of the standalone node task, ``ddlaunch.worker.node_task``);
2. ``import_torch``: an import failure is written into that report, then the rank fails;
3. ``check``: join the process group; time an all-reduce over every rank and an exchange
   between ring-neighbour nodes (local rank 0 of each node); gather every node's report;
   every rank joins them into the same verdicts (pure: ``verdicts.join_reports``/``decide``).
   Rank 0 records them (``health/preflight.json``, the attempt, this attempt's gate record).
   Every node passed: training starts. Otherwise every rank raises ``PreflightFailed``; the
   end hook (``job.preflight.preflight_outcome``) excludes the failing nodes and requeues, or stops
   the run, as the separate step did.

A node whose ranks never reach step 3 (torch broken, node dead or hung) leaves no complete
report: its peers wait in the rendezvous until srun ends (``--kill-on-bad-exit``) or the
watchdog ends the step after ``health.preflight_timeout``; the end hook then judges from the
reports on disk, where a node without a report fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ddlaunch.health import checks
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.policy import preflight as verdicts
from ddlaunch.runner import SubprocessRunner
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.store import attempts
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker.distenv import DistEnv, master_port_for
from ddlaunch.worker.distributed import init_distributed
from ddlaunch.worker.stops import StopRank

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config

GATE_EXIT = 75
# Transfer sizes: enough to measure bandwidth rather than latency on the fabric each backend
# uses (4 MB over gloo's TCP takes ~10 ms at 4 Gbit/s), small enough to cost well under a
# second even on a slow link; the best of RUNS (the first one also opens connections).
GLOO_BYTES = 4 * 2**20
NCCL_BYTES = 64 * 2**20
RUNS = 3


class PreflightFailed(StopRank):
    """Raised on every rank when a node failed preflight: no training step runs. Not a crash
    of the rank (no failure record); the end hook acts on the recorded verdicts."""

    def __init__(self, reason: str) -> None:
        super().__init__(GATE_EXIT, reason)


def enabled(cfg: Config, env: Mapping[str, str]) -> bool:
    """Preflight runs in Slurm jobs only, as before (a local run has no nodes to exclude),
    and not in replica groups: its verdicts, its gate record and the end hook's judgement are
    one per attempt, while groups start and fail apart (``render`` warns)."""
    if GroupIdentity.from_env(env) is not None:
        return False
    return bool(cfg.health.preflight) and env.get("SUBMITIT_EXECUTOR") == "slurm"


def node_phase(
    cfg: Config, run_dir: Path, d: DistEnv, env: Mapping[str, str], host: str
) -> verdicts.NodeReport | None:
    """Step 1 on local rank 0 (None elsewhere): GPUs and free space, no torch."""
    if d.local_rank != 0:
        return None
    attempt = AttemptId.from_env(env)
    inject = checks.injection(env.get(checks.INJECT_VAR), host, d.node_rank, attempt.restart)
    found, facts = checks.node_checks(cfg, run_dir, env, SubprocessRunner(), inject)
    report: verdicts.NodeReport = {
        "host": host,
        "index": d.node_rank,
        "time": time.time(),
        "facts": facts,
        "checks": [c.as_dict() for c in found],
    }
    # Written at once: a node that dies or hangs later still leaves its facts behind.
    _write(run_dir, env, report)
    report["inject"] = inject  # for import_torch; not part of the written report
    return report


def _write(run_dir: Path, env: Mapping[str, str], report: verdicts.NodeReport) -> None:
    records.write_report(run_dir, AttemptId.from_env(env), report["host"], report)


def import_torch(run_dir: Path, env: Mapping[str, str], report: verdicts.NodeReport | None) -> None:
    """Step 2: import torch, timed; the node report (local rank 0) records the outcome and is
    written before a failure propagates, so the end hook can blame this node."""
    inject = report.pop("inject", {}) if report is not None else {}
    started = time.monotonic()
    injected = inject.get("torch_error")
    version, error = None, str(injected) if injected else None
    failure: BaseException | None = None
    if not error:
        try:
            import torch

            version = str(torch.__version__)
        except Exception as exc:  # any import failure is the finding
            error, failure = f"{type(exc).__name__}: {exc}", exc
    took = time.monotonic() - started
    if report is not None:
        report["facts"]["torch"] = {"version": version, "error": error, "import_s": round(took, 2)}
        report["checks"].append(verdicts.torch_check(version, error, took).as_dict())
        _write(run_dir, env, report)
    if error:
        raise PreflightFailed(f"import torch failed: {error}") from failure


class _Member(TypedDict):
    """What each rank tells the others before the test."""

    rank: int
    node: int
    leader: bool


def _leaders(gathered: list[_Member]) -> list[int]:
    """Global ranks of the node leaders (local rank 0), in node order."""
    return [g["rank"] for g in sorted(gathered, key=lambda g: g["node"]) if g["leader"]]


def measure(backend: str, rank: int, world: int, leaders: list[int]) -> verdicts.NetReport:
    """All-reduce bus bandwidth over every rank (nccl-tests' convention) and, on a node leader,
    the rate of an exchange with its ring neighbours (per-node attribution: see
    ``verdicts.bandwidth_checks``). Collective: every rank calls it."""
    import torch
    import torch.distributed as dist

    if world < 2:
        return {"backend": backend, "world": world, "skipped": "single rank: no collective test"}
    nbytes = NCCL_BYTES if backend == "nccl" else GLOO_BYTES
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
    data = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(data)

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    def timed_allreduce() -> float:
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(data)
        sync()
        return time.perf_counter() - t0

    per = min(timed_allreduce() for _ in range(RUNS))
    net: verdicts.NetReport = {
        "backend": backend,
        "world": world,
        "bytes": nbytes,
        "allreduce_gbps": round(2 * (world - 1) / world * nbytes / per * 8 / 1e9, 3),
    }
    if len(leaders) < 2:
        net["skipped"] = "single node: no inter-node test"
        return net
    times = []
    for _ in range(RUNS):
        dist.barrier()  # every rank: the exchanges start together
        if rank not in leaders:
            continue
        i = leaders.index(rank)
        t0 = time.perf_counter()
        nxt, prv = leaders[(i + 1) % len(leaders)], leaders[i - 1]
        for req in (dist.isend(data, nxt), dist.irecv(recv, prv)):
            if req is not None:  # None only for a rank outside the group
                req.wait()
        sync()
        times.append(time.perf_counter() - t0)
    if times:
        net["ring_gbps"] = round(nbytes * 8 / 1e9 / min(times), 3)
    return net


def _join(backend: str, d: DistEnv, keep_group: bool, run_dir: Path) -> None:
    """Join the process group. An entry point keeps it (``init_distributed`` is idempotent);
    a torchrun script calls ``init_process_group`` itself, so its ranks use a group of their
    own on another port and leave it afterwards."""
    import torch.distributed as dist

    if keep_group:
        init_distributed()
        return
    port = master_port_for(f"{d.job_id}/preflight", d.restart_count)
    dist.init_process_group(
        backend, init_method=f"tcp://{d.master_addr}:{port}", rank=d.rank, world_size=d.world_size
    )


def check(
    cfg: Config,
    run_dir: Path,
    d: DistEnv,
    env: Mapping[str, str],
    report: verdicts.NodeReport | None,
    backend: str,
    keep_group: bool,
) -> None:
    """Step 3: bandwidth, verdicts, the gate. Raises ``PreflightFailed`` on every rank when a
    node failed; returns when training may start."""
    import torch.distributed as dist

    started = time.monotonic()
    _join(backend, d, keep_group, run_dir)
    joined = time.monotonic()
    try:
        mine: _Member = {"rank": d.rank, "node": d.node_rank, "leader": report is not None}
        gathered: list[_Member | None] = [None] * d.world_size
        dist.all_gather_object(gathered, mine)
        members = [g for g in gathered if g is not None]  # every one, after the gather
        net = measure(backend, d.rank, d.world_size, _leaders(members))
        if report is not None:
            # The rendezvous is training's own; the test proper is the rest.
            net["join_s"] = round(joined - started, 2)
            net["test_s"] = round(time.monotonic() - joined, 2)
            report["net"] = net
            report["elapsed_s"] = round(time.monotonic() - started, 2)
            _write(run_dir, env, report)
        reports: list[verdicts.NodeReport | None] = [None] * d.world_size
        dist.all_gather_object(reports, report)
        by_host = {r["host"]: r for r in reports if r is not None}
        # The step's nodes: with hot spares the step runs on part of the allocation.
        step = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        nodes = expand_hostlist(step) or sorted(by_host)
        results = verdicts.evaluate(cfg, nodes, by_host)
        decision = verdicts.decide(results)
        passed = not decision.exclude and not decision.stop
        if d.rank == 0:
            record(run_dir, env, nodes, results, decision.reason, passed, by_host)
        if not passed:
            # Rank 0's record must be on disk before any rank exits: srun's kill-on-bad-exit
            # ends the others as soon as one exits.
            dist.barrier()
            raise PreflightFailed(decision.reason)
    finally:
        if not keep_group and dist.is_initialized():
            dist.destroy_process_group()


def wait_for_attempt(run_dir: Path, attempt: AttemptId, timeout: float = 30.0) -> bool:
    """Wait until the start hook (which runs beside srun) has saved this attempt's record, so
    that adding the verdicts to it cannot race with its write. Normally it is long there: the
    hook takes a fraction of a second, the ranks seconds to import torch."""
    deadline = time.monotonic() + timeout
    while True:
        saved = attempts.load(run_dir)
        if saved and attempt.matches(saved[-1]):
            return True
        if time.monotonic() > deadline:
            print("[ddlaunch] warning: no attempt record from the start hook", flush=True)
            return False
        time.sleep(0.1)


def record(
    run_dir: Path,
    env: Mapping[str, str],
    nodes: list[str],
    results: list[verdicts.NodeVerdict],
    reason: str,
    passed: bool,
    reports: Mapping[str, verdicts.NodeReport],
) -> None:
    """Rank 0: the verdicts for ``status`` and ``report``, the attempt, the gate record."""
    attempt = AttemptId.from_env(env)
    wait_for_attempt(run_dir, attempt)
    records.record_verdicts(run_dir, attempt, list(nodes), *verdicts.as_records(results), reason)
    for node in nodes:
        if node in reports:
            print(verdicts.node_report_line(reports[node]), flush=True)
    print(f"[ddlaunch] preflight: {reason}", flush=True)
    gate = records.Gate(
        job_id=attempt.job_id,
        restart=attempt.restart,
        passed=passed,
        reason=reason,
        time=time.time(),
        pid=os.getpid(),
    )
    records.write_gate(run_dir, attempt, gate)
