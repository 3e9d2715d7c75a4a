"""The preflight node task: ``python -m ddlaunch.health.preflight`` (one srun task per node).

Phase 1 (torch-free facts, then ``import torch``): GPUs visible vs requested, free space in
the checkpoint directory and scratch, whether torch imports. The report is written to
``<run_dir>/health/preflight/<job>-<restart>/<host>.json`` at once, so a node that dies later
still leaves its facts behind.

Phase 2 (bandwidth): the nodes whose torch works wait for each other's reports on the shared
run directory, form a process group among themselves (gloo on CPU, nccl with CUDA; no node
waits for one that cannot join), time an all-reduce (bus bandwidth, nccl-tests' convention)
and an exchange with their ring neighbours (per-node attribution; see
``verdicts.bandwidth_checks``). Every wait is bounded by ``health.preflight_timeout``.

Verdicts are not made here: the batch-script hook joins the reports (``ddlaunch.health.hooks``).

Testing hook: ``$DDLAUNCH_HEALTH_INJECT`` holds a JSON list of overrides, each applied to the
node named by ``node`` (host name) or ``index`` (position in the allocation), optionally only
at ``restart`` N: ``free_gb`` (every checked path), ``gpus`` (GPUs assigned), ``torch_error``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddlaunch.health import verdicts as v
from ddlaunch.runner import Runner, SubprocessRunner

INJECT_VAR = "DDLAUNCH_HEALTH_INJECT"
PREFLIGHT_DIR = ("health", "preflight")


def reports_dir(run_dir: Path, job_id: str, restart: int) -> Path:
    return run_dir.joinpath(*PREFLIGHT_DIR) / f"{job_id or 'local'}-{restart}"


def injection(spec: str | None, host: str, index: int, restart: int) -> dict[str, Any]:
    """The overrides of ``$DDLAUNCH_HEALTH_INJECT`` that apply to this node and attempt."""
    if not spec:
        return {}
    try:
        items = json.loads(spec)
    except ValueError:
        return {}
    merged: dict[str, Any] = {}
    for item in items if isinstance(items, list) else [items]:
        if not isinstance(item, dict):
            continue
        if "node" in item and item["node"] != host:
            continue
        if "index" in item and int(item["index"]) != index:
            continue
        if "restart" in item and int(item["restart"]) != restart:
            continue
        merged.update({k: val for k, val in item.items() if k not in ("node", "index", "restart")})
    return merged


def assigned_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs Slurm gave this step: CUDA_VISIBLE_DEVICES, else the gres variables."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is None:
            continue
        value = value.strip()
        if value in ("", "NoDevFiles"):
            return 0
        return len([x for x in value.split(",") if x.strip()])
    value = env.get("SLURM_GPUS_ON_NODE")
    return int(value) if value and value.isdigit() else None


def nvidia_smi(runner: Runner) -> tuple[int | None, str | None]:
    """(GPUs listed, error) from ``nvidia-smi -L``; (None, None) when it is not installed."""
    if shutil.which("nvidia-smi") is None:
        return None, None
    result = runner.run(["nvidia-smi", "-L"], timeout=60)
    if not result.ok:
        detail = (result.stderr or result.stdout).strip().splitlines()
        return None, detail[-1] if detail else f"exit {result.returncode}"
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU ")), None


def free_gb(path: str) -> tuple[float | None, str]:
    """Free space for an unprivileged writer at ``path`` (or its nearest existing parent: the
    checkpoint directory may not exist before the first save)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return None, str(exc)
    return st.f_bavail * st.f_frsize / 1e9, ""


def checked_paths(cfg: Any, run_dir: Path, env: Mapping[str, str]) -> list[tuple[str, str]]:
    ckpt = env.get("DDLAUNCH_CHECKPOINT_DIR") or cfg.storage.checkpoint_dir
    paths = [("checkpoints", ckpt or str(run_dir / "checkpoints"))]
    scratch = env.get("DDLAUNCH_SCRATCH") or cfg.storage.scratch
    if scratch:
        paths.append(("scratch", os.path.expandvars(scratch)))
    return paths


def node_checks(
    cfg: Any, run_dir: Path, env: Mapping[str, str], runner: Runner, inject: Mapping[str, Any]
) -> tuple[list[v.Check], dict[str, Any]]:
    """The torch-free part of phase 1 (GPUs, free space); returns the checks and the facts
    behind them. The in-rank preflight (``ddlaunch.health.gate``) runs it before torch."""
    facts: dict[str, Any] = {}
    assigned = assigned_gpus(env)
    smi_count, smi_error = nvidia_smi(runner)
    if "gpus" in inject:
        assigned = int(inject["gpus"])
        smi_count = min(smi_count, assigned) if smi_count is not None else None
    facts["gpus"] = {"assigned": assigned, "nvidia_smi": smi_count, "error": smi_error}
    checks = [v.gpu_check(cfg.nodes.gpus_per_node, assigned, smi_count, smi_error)]
    for label, path in checked_paths(cfg, run_dir, env):
        free, error = free_gb(path)
        if "free_gb" in inject:
            free, error = float(inject["free_gb"]), ""
        facts[f"free_gb:{label}"] = free
        checks.append(v.disk_check(label, path, free, cfg.health.min_free_gb, error))
    return checks, facts


def local_checks(
    cfg: Any, run_dir: Path, env: Mapping[str, str], runner: Runner, inject: Mapping[str, Any]
) -> tuple[list[v.Check], dict[str, Any]]:
    """Phase 1 of the node task; returns the checks and the facts behind them."""
    checks, facts = node_checks(cfg, run_dir, env, runner, inject)
    started = time.monotonic()
    version, error = None, inject.get("torch_error")
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


def write_report(directory: Path, host: str, report: dict[str, Any]) -> None:
    from ddlaunch import fsutil

    fsutil.atomic_write_json(directory / f"{host}.json", report)


def wait_for_reports(directory: Path, count: int, deadline: float) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    while True:
        for path in directory.glob("*.json"):
            if path.stem not in reports:
                try:
                    reports[path.stem] = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
        if len(reports) >= count or time.monotonic() > deadline:
            return reports
        time.sleep(0.5)


def bandwidth_phase(
    cfg: Any,
    host: str,
    nodes: list[str],
    reports: Mapping[str, Mapping[str, Any]],
    port: int,
    deadline: float,
) -> dict[str, Any]:
    """Time an all-reduce and a ring exchange among the nodes whose torch imported."""
    able = [n for n in nodes if n in reports and not reports[n]["facts"]["torch"]["error"]]
    if host not in able:
        return {"skipped": "not part of the test"}
    if len(able) < 2:
        return {"skipped": "fewer than two nodes could join the all-reduce test"}
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from ddlaunch.worker.distenv import choose_backend

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
            reqs = [dist.isend(data, nxt), dist.irecv(recv, prv)]
            for req in reqs:
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


def doctor_findings(cfg: Any, runner: Runner) -> list[dict[str, str]]:
    """``ddlaunch doctor``: compare the node with its fabric profile where the tools exist."""
    try:
        from ddlaunch import fabric_check
    except ImportError as exc:
        return [{"check": "fabric", "status": "unchecked", "detail": f"fabric_check: {exc}"}]
    outputs: dict[str, str | None] = {}
    for key, argv in fabric_check.COMMANDS.items():
        if shutil.which(argv[0]) is None:
            outputs[key] = None
            continue
        result = runner.run(list(argv), timeout=30)
        outputs[key] = result.stdout if result.ok else None
    try:
        findings = fabric_check.check_node(cfg, outputs)
    except Exception as exc:  # a parser bug must not hide the other checks
        return [{"check": "fabric", "status": "unchecked", "detail": f"fabric_check failed: {exc}"}]
    return [{"check": f.check, "status": str(f.status), "detail": f.detail} for f in findings]


def run(
    env: Mapping[str, str], runner: Runner | None = None, doctor: bool = False
) -> dict[str, Any]:
    from ddlaunch.config import load_config
    from ddlaunch.worker.distenv import expand_hostlist, master_port_for

    runner = runner or SubprocessRunner()
    run_dir = Path(env["DDLAUNCH_RUN_DIR"])
    cfg = load_config(run_dir / "config.yaml")
    started = time.monotonic()
    deadline = started + cfg.health.preflight_timeout * 0.8
    host = socket.gethostname()
    job_id = env.get("SLURM_JOB_ID", "")
    restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [host]
    index = nodes.index(host) if host in nodes else int(env.get("SLURM_NODEID", "0") or 0)
    inject = injection(env.get(INJECT_VAR), host, index, restart)
    directory = reports_dir(run_dir, job_id, restart)
    checks, facts = local_checks(cfg, run_dir, env, runner, inject)
    report: dict[str, Any] = {
        "host": host,
        "index": index,
        "time": time.time(),
        "facts": facts,
        "checks": [c.as_dict() for c in checks],
    }
    if doctor:
        report["fabric"] = doctor_findings(cfg, runner)
    write_report(directory, host, report)
    if facts["torch"]["error"]:
        report["net"] = {"skipped": "torch does not import"}
    elif len(nodes) < 2:
        report["net"] = {"skipped": "single node: no inter-node test"}
    else:
        reports = wait_for_reports(directory, len(nodes), deadline)
        port = master_port_for(f"{job_id}/preflight", restart)
        try:
            report["net"] = bandwidth_phase(cfg, host, nodes, reports, port, deadline)
        except Exception as exc:  # a failed test is a finding, never a crash of the task
            report["net"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["elapsed_s"] = round(time.monotonic() - started, 2)
    write_report(directory, host, report)
    return report


def summary_line(report: Mapping[str, Any]) -> str:
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    net = report.get("net", {})
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


def catch_preempt_signal(env: Mapping[str, str]) -> list[str]:
    """The pre-timeout signal goes to every running step, this one too if it comes early.
    Its default action would kill the task (and so fail the node); instead it is noted in
    the report, and the watchdog hands it on to the training step (see ``hooks``)."""
    import signal

    from ddlaunch.worker.signals import signal_number

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
    report = run(os.environ, doctor="--doctor" in args)
    if received:
        report["signal"] = received[0]
        run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
        directory = reports_dir(
            run_dir,
            os.environ.get("SLURM_JOB_ID", ""),
            int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        )
        write_report(directory, report["host"], report)
    print(summary_line(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
