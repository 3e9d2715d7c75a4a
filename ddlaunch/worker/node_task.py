"""The preflight node task: ``python -m ddlaunch.worker.node_task [--doctor]``, one srun task
per node, for ``ddlaunch doctor`` (and, with ``--spare``, the hot spares' checks, ``job.hooks
spares``).
Training jobs run the same checks inside their ranks instead (``ddlaunch.worker.gate``).

Phase 1 (torch-free facts, then ``import torch``): the node checks of ``ddlaunch.health``. The
report is written to ``<run_dir>/health/preflight/<job>-<restart>/<host>.json`` at once, so a
node that dies later still leaves its facts behind.

Phase 2 (bandwidth): the nodes whose torch works wait for each other's reports on the shared
run directory, form a process group among themselves (gloo on CPU, nccl with CUDA; no node
waits for one that cannot join), time an all-reduce (bus bandwidth, nccl-tests' convention)
and an exchange with their ring neighbours (per-node attribution; see
``policy.preflight.bandwidth_checks``). Every wait is bounded by ``health.preflight_timeout``.

Verdicts are not made here: whoever reads the reports joins them (``policy.preflight``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ddlaunch.config import load_config
from ddlaunch.health.checks import INJECT_VAR, doctor_findings, injection, node_checks
from ddlaunch.policy import preflight as v
from ddlaunch.policy.preflight import NetReport, NodeReport, node_report_line
from ddlaunch.runner import Runner, SubprocessRunner
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import config_path
from ddlaunch.worker.distenv import choose_backend, master_port_for
from ddlaunch.worker.signals import signal_number

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config


def local_checks(
    cfg: Config, run_dir: Path, env: Mapping[str, str], runner: Runner, inject: Mapping[str, object]
) -> tuple[list[v.Check], dict[str, object]]:
    """Phase 1 of the node task; returns the checks and the facts behind them."""
    checks, facts = node_checks(cfg, run_dir, env, runner, inject)
    started = time.monotonic()
    version, error = None, _text(inject.get("torch_error"))
    if not error:
        try:
            import torch

            version = str(torch.__version__)
        except Exception as exc:  # any import failure is the finding
            error = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    facts["torch"] = {"version": version, "error": error, "import_s": round(took, 2)}
    checks.append(v.torch_check(version, error, took))
    return checks, facts


def _text(value: object) -> str | None:
    """An injected error (``torch_error``): its text, None for none."""
    return str(value) if value else None


def torch_failed(report: NodeReport) -> bool:
    """Whether the node's torch did not import (a report without the torch facts: not
    known to import)."""
    torch = report["facts"].get("torch")
    return not isinstance(torch, dict) or bool(torch.get("error"))


def wait_for_reports(directory: Path, count: int, deadline: float) -> dict[str, NodeReport]:
    reports: dict[str, NodeReport] = {}
    while True:
        for path in directory.glob("*.json"):
            if path.stem not in reports:
                try:
                    reports[path.stem] = cast(NodeReport, json.loads(path.read_text()))
                except (OSError, ValueError):
                    continue
        if len(reports) >= count or time.monotonic() > deadline:
            return reports
        time.sleep(0.5)


def bandwidth_phase(
    cfg: Config,
    host: str,
    nodes: list[str],
    reports: Mapping[str, NodeReport],
    port: int,
    deadline: float,
) -> NetReport:
    """Time an all-reduce and a ring exchange among the nodes whose torch imported."""
    able = [n for n in nodes if n in reports and not torch_failed(reports[n])]
    if host not in able:
        return {"skipped": "not part of the test"}
    if len(able) < 2:
        return {"skipped": "fewer than two nodes could join the all-reduce test"}
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = choose_backend(cfg.launch.backend, cuda)
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    rank, world = able.index(host), len(able)
    remaining = max(deadline - time.monotonic(), 10.0)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{able[0]}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=remaining),
    )
    try:
        # 64 MB with nccl, 16 MB with gloo: long enough to measure bandwidth rather than
        # latency, short enough to cost about a second on a slow TCP link.
        numel = (64 if backend == "nccl" else 16) * 2**20 // 4
        data = torch.ones(numel, dtype=torch.float32, device=device)

        def sync() -> None:
            if backend == "nccl":
                torch.cuda.synchronize()

        dist.all_reduce(data)  # warm-up: connections, buffers
        sync()
        iters = 5 if backend == "nccl" else 3
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        sync()
        per = (time.perf_counter() - start) / iters
        nbytes = numel * 4
        busbw = 2 * (world - 1) / world * nbytes / per * 8 / 1e9
        recv = torch.empty_like(data)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            for req in (dist.isend(data, nxt), dist.irecv(recv, prv)):
                if req is not None:  # None only for a rank outside the group
                    req.wait()
            sync()
            times.append(time.perf_counter() - t0)
        ring = nbytes * 8 / 1e9 / min(times)
        return {
            "backend": backend,
            "world": world,
            "bytes": nbytes,
            "allreduce_gbps": round(busbw, 3),
            "ring_gbps": round(ring, 3),
        }
    finally:
        dist.destroy_process_group()


def run(
    env: Mapping[str, str], runner: Runner | None = None, doctor: bool = False, spare: bool = False
) -> NodeReport:
    """This node's preflight report (written as soon as known). ``spare``: a hot spare,
    checked beside the training step: local checks only, into the spares' reports."""
    runner = runner or SubprocessRunner()
    run_dir = Path(env["DDLAUNCH_RUN_DIR"])
    cfg = load_config(config_path(run_dir))
    started = time.monotonic()
    deadline = started + cfg.health.preflight_timeout * 0.8
    host = socket.gethostname()
    attempt = AttemptId.from_env(env)
    step = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    nodes = expand_hostlist(step) or [host]
    index = nodes.index(host) if host in nodes else int(env.get("SLURM_NODEID", "0") or 0)
    inject = injection(env.get(INJECT_VAR), host, index, attempt.restart)
    checks, facts = local_checks(cfg, run_dir, env, runner, inject)
    report: NodeReport = {
        "host": host,
        "index": index,
        "time": time.time(),
        "facts": facts,
        "checks": [c.as_dict() for c in checks],
    }
    if doctor:
        report["fabric"] = doctor_findings(cfg, runner)
    if spare:
        report["net"] = {"skipped": "hot spare: local checks only"}
        report["elapsed_s"] = round(time.monotonic() - started, 2)
        records.write_report(run_dir, attempt, host, report, spare=True)
        return report
    records.write_report(run_dir, attempt, host, report)
    if torch_failed(report):
        report["net"] = {"skipped": "torch does not import"}
    elif len(nodes) < 2:
        report["net"] = {"skipped": "single node: no inter-node test"}
    else:
        reports = wait_for_reports(records.reports_dir(run_dir, attempt), len(nodes), deadline)
        port = master_port_for(f"{attempt.job_id}/preflight", attempt.restart)
        try:
            report["net"] = bandwidth_phase(cfg, host, nodes, reports, port, deadline)
        except Exception as exc:  # a failed test is a finding, never a crash of the task
            report["net"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["elapsed_s"] = round(time.monotonic() - started, 2)
    records.write_report(run_dir, attempt, host, report)
    return report


def catch_preempt_signal(env: Mapping[str, str]) -> list[str]:
    """The pre-timeout signal goes to every running step, this one too if it comes early.
    Its default action would kill the task (and so fail the node); instead it is noted in
    the report."""
    received: list[str] = []

    def note(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)

    for name in {env.get("SUBMITIT_PREEMPT_SIGNAL") or "USR2", "USR2"}:
        try:
            signal.signal(signal_number(name), note)
        except (ValueError, OSError):
            continue
    return received


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    received = catch_preempt_signal(os.environ)
    report = run(os.environ, doctor="--doctor" in args, spare="--spare" in args)
    if received and "--spare" not in args:
        report["signal"] = received[0]
        run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
        records.write_report(run_dir, AttemptId.from_env(os.environ), report["host"], report)
    print(node_report_line(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
