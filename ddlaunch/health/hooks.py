"""Health steps of the batch script (torch-free), called from ``ddlaunch.jobhooks``.

``preflight_outcome``: in the end hook, after the ranks failed: if this attempt failed
preflight (the in-rank gate, ``ddlaunch.health.gate``, or node reports on disk when the ranks
ended before the verdict), exclude the failing nodes and requeue, or stop the run when every
node failed alike or no requeue is left (``apply_decision``). ``preflight_hook`` does the same
around a separate srun step of node tasks (``jobhooks preflight``; the batch script no longer
runs it).

``apply_watchdog_verdict``: in the end hook, turn the watchdog's verdict for this attempt into
the attempt's cause and blamed nodes, and exclude those nodes.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from ddlaunch import attempts, fsutil
from ddlaunch.health import badnodes, policy, preflight, verdicts
from ddlaunch.health.watchdog import read_verdict

REQUEUED = 75  # the batch script exits 0 without training: Slurm restarts the job
STOPPED = 76  # the batch script exits 1 without training: the outcome is recorded
LATEST_PREFLIGHT = ("health", "preflight.json")


def requeue_excluding(client: Any, job_id: str, nodes: list[str]) -> bool:
    """Requeue the running job so that its next start avoids ``nodes``.

    Slurm 22.05 refuses ``ExcNodeList`` updates while a job runs ("Job is no longer pending
    execution"; measured on the dev cluster), so when setting it first fails, the order is:
    requeue, then update the now pending job while its batch step is being torn down. That
    teardown sends SIGTERM to this process, which is ignored for the second or two this
    takes (SIGKILL follows only after KillWait). Returns whether the exclusion was set."""
    import signal
    import time

    if not nodes or client.exclude_nodes(job_id, nodes):
        client.requeue(job_id)
        return True
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        client.requeue(job_id)
        for _ in range(20):
            if not nodes or client.exclude_nodes(job_id, nodes):
                return True
            time.sleep(0.2)
        print(f"[ddlaunch] warning: could not exclude {','.join(nodes)}", flush=True)
        return False
    finally:
        signal.signal(signal.SIGTERM, previous)


def preflight_argv(
    python: str, nodes: int, timeout_s: int, log_dir: Path, doctor: bool = False
) -> list[str]:
    return [
        "srun",
        # Explicit logs: a sweep task exports SLURM_STDOUTMODE for the training ranks' logs.
        f"--output={log_dir / 'preflight-%N.out'}",
        f"--error={log_dir / 'preflight-%N.out'}",
        "--open-mode=append",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        f"--time={max(1, math.ceil(timeout_s / 60))}",
        "--job-name=ddlaunch-preflight",
        python,
        "-m",
        "ddlaunch.health.preflight",
        *(["--doctor"] if doctor else []),
    ]


def read_reports(directory: Path) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            reports[path.stem] = fsutil.read_json(path) or {}
        except (OSError, ValueError):
            continue
    return reports


def evaluate(
    cfg: Any, nodes: list[str], reports: dict[str, dict[str, Any]]
) -> list[verdicts.NodeVerdict]:
    backends = [
        (r.get("net") or {}).get("backend")
        for r in reports.values()
        if (r.get("net") or {}).get("backend")
    ]
    floor = verdicts.bandwidth_floor(
        cfg.health.min_bandwidth_gbps, backends[0] if backends else "gloo", cfg.fabric.kind
    )
    return verdicts.join_reports(nodes, reports, floor)


def run_preflight_step(
    cfg: Any, run_dir: Path, client: Any, doctor: bool = False
) -> tuple[list[str], dict]:
    """Run the node task everywhere; return (nodes, reports)."""
    from ddlaunch.worker.distenv import expand_hostlist

    nodes = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    timeout = cfg.health.preflight_timeout
    argv = preflight_argv(cfg.launch.python, len(nodes), timeout, run_dir / "logs", doctor)
    result = client.run_step(argv, timeout=timeout + 30)
    for line in (result.stdout + result.stderr).splitlines():
        if line.strip():
            print(line, flush=True)
    reports = read_reports(preflight.reports_dir(run_dir, job_id, restart))
    for node in nodes:
        report = reports.get(node)
        if report is not None:
            print(preflight.summary_line(report), flush=True)
    return nodes, reports


def attempt_verdicts(results: list[verdicts.NodeVerdict]) -> list[dict[str, Any]]:
    """The per-node verdicts as the attempt record keeps them."""
    return [
        {"node": v.node, "ok": v.ok, **({"reason": v.reason()} if not v.ok else {})}
        for v in results
    ]


def record_verdicts(
    run_dir: Path, nodes: list[str], results: list[verdicts.NodeVerdict], reason: str
) -> None:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    fsutil.atomic_write_json(
        run_dir.joinpath(*LATEST_PREFLIGHT),
        {
            "job_id": job_id,
            "nodes": nodes,
            "verdicts": verdicts.verdicts_as_dict(results),
            "decision": reason,
        },
        0o600,
    )
    records = attempts.load(run_dir)
    if records and "end" not in records[-1]:
        records[-1]["preflight"] = attempt_verdicts(results)
        attempts.save(run_dir, records)


def preflight_hook(run_dir: Path, client: Any) -> int:
    """``jobhooks preflight``: the checks as a separate srun step before training (the
    batch script runs them inside the ranks instead, ``ddlaunch.health.gate``)."""
    from ddlaunch.config import load_config

    cfg = load_config(run_dir / "config.yaml")
    if not cfg.health.preflight:
        return 0
    nodes, reports = run_preflight_step(cfg, run_dir, client)
    defer_signal(run_dir, reports)
    results = evaluate(cfg, nodes, reports)
    decision = verdicts.decide(results)
    record_verdicts(run_dir, nodes, results, decision.reason)
    print(f"[ddlaunch] preflight: {decision.reason}", flush=True)
    return apply_decision(cfg, run_dir, client, decision)


def preflight_outcome(
    run_dir: Path, client: Any, nodes: list[str], failed: bool = True
) -> int | None:
    """End hook: did this attempt fail preflight (inside the ranks)? (``failed``: srun
    returned nonzero; otherwise only the verdicts are printed, if nobody did yet.)

    The gate record says so when the ranks got that far; otherwise the node reports on disk
    decide (a node without one died, hung or could not import torch before the verdict).
    Returns the script's exit code (0 requeued, 1 stopped) or None: not a preflight failure,
    the usual crash handling applies."""
    from ddlaunch.config import load_config
    from ddlaunch.health import gate

    if not nodes:
        return None
    job_id, restart = gate.attempt_of(os.environ)
    record = gate.read_gate(run_dir, job_id, restart)
    reports = read_reports(preflight.reports_dir(run_dir, job_id, restart))
    if record is not None and record.get("passed"):
        print_verdicts(run_dir, nodes, reports, record)
        return None
    # No reports: preflight is off, or the ranks never got as far (srun itself failed).
    if not failed or not reports:
        return None
    cfg = load_config(run_dir / "config.yaml")
    results = evaluate(cfg, nodes, reports)
    decision = verdicts.decide(results)
    if not decision.exclude and not decision.stop:
        return None
    if record is None:
        # The ranks ended before the verdict: record it here.
        record_verdicts(run_dir, nodes, results, decision.reason)
    print_verdicts(run_dir, nodes, reports, record or {"reason": decision.reason})
    return 0 if apply_decision(cfg, run_dir, client, decision) == REQUEUED else 1


def print_verdicts(
    run_dir: Path, nodes: list[str], reports: dict[str, dict[str, Any]], record: dict[str, Any]
) -> None:
    """Into the batch log, once per attempt (the watchdog does it as soon as the gate opens;
    this covers an attempt that ended first)."""
    from ddlaunch.health import gate

    if record.get("printed"):
        return
    for node in nodes:
        if node in reports:
            print(preflight.summary_line(reports[node]), flush=True)
    print(f"[ddlaunch] preflight: {record.get('reason', '')}", flush=True)
    if "job_id" in record:
        gate.mark_printed(run_dir, str(record["job_id"]), int(record.get("restart", 0)), record)


def apply_decision(cfg: Any, run_dir: Path, client: Any, decision: verdicts.Decision) -> int:
    """Act on the preflight decision: 0 (train), ``REQUEUED`` (failing nodes excluded, job
    requeued) or ``STOPPED`` (outcome recorded)."""
    from ddlaunch.jobhooks import add_excluded, committed_step, excluded

    if not decision.exclude and not decision.stop:
        return 0
    job_id = os.environ.get("SLURM_JOB_ID", "")
    records = attempts.load(run_dir)
    step = committed_step(run_dir)
    current = records[-1] if records else {}
    if decision.stop:
        attempts.end_last(
            run_dir,
            cause=policy.CAUSE_PREFLIGHT,
            committed_step=step,
            blamed=[],
            decision=decision.reason,
        )
        attempts.write_outcome(run_dir, "FAILED", decision.reason)
        print(f"[ddlaunch] FAILED: {decision.reason}", flush=True)
        return STOPPED
    blamed = list(decision.exclude)
    add_excluded(run_dir, blamed, decision.reason)
    badnodes.record(blamed, decision.reason, cfg.health.bad_node_ttl_hours, f"run {run_dir.name}")
    outcome = policy.decide(
        cause=policy.CAUSE_PREFLIGHT,
        blamed=blamed,
        committed_now=step,
        resumed_from=current.get("resumed_from"),
        requeues_so_far=max(len(records) - 1, 0),
        max_requeues=cfg.fault_tolerance.max_requeues,
    )
    attempts.end_last(
        run_dir,
        cause=policy.CAUSE_PREFLIGHT,
        committed_step=step,
        blamed=blamed,
        decision=outcome.reason,
        health=decision.reason,
    )
    if outcome.requeue and job_id:
        print(f"[ddlaunch] {outcome.reason}", flush=True)
        from ddlaunch.slurm.parse import requeue_target

        requeue_excluding(client, requeue_target(os.environ), excluded(run_dir))
        return REQUEUED
    attempts.write_outcome(run_dir, "FAILED", outcome.reason)
    print(f"[ddlaunch] FAILED: {outcome.reason}", flush=True)
    return STOPPED


def deferred_signal_path(run_dir: Path, job_id: str, restart: int) -> Path:
    return run_dir / "health" / f"deferred-signal-{job_id or 'local'}-{restart}.json"


def defer_signal(run_dir: Path, reports: dict[str, dict[str, Any]]) -> None:
    """The pre-timeout signal arrived during preflight (Slurm sends it once): leave it for
    the watchdog, which sends it to the training step once its ranks report."""
    names = [str(r["signal"]) for r in reports.values() if r.get("signal")]
    if not names:
        return
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    fsutil.atomic_write_json(
        deferred_signal_path(run_dir, job_id, restart), {"signal": names[0]}, 0o600
    )
    print(f"[ddlaunch] {names[0]} arrived during preflight; passed on to the training step")


def apply_watchdog_verdict(
    run_dir: Path, current: dict[str, Any]
) -> tuple[str, list[str], str] | None:
    """(cause, blamed nodes, detail) when the watchdog ended this attempt, else None."""
    from ddlaunch.config import load_config
    from ddlaunch.jobhooks import add_excluded

    job_id = os.environ.get("SLURM_JOB_ID", "") or str(current.get("job_id", ""))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", current.get("restart_count", 0)) or 0)
    verdict = read_verdict(run_dir, job_id, restart)
    if not verdict:
        return None
    blamed = sorted(str(n) for n in verdict.get("nodes", []))
    detail = str(verdict.get("detail", ""))
    cause = str(verdict.get("cause", policy.CAUSE_HANG))
    if blamed:
        add_excluded(run_dir, blamed, f"{cause}: {detail}")
        try:
            ttl = load_config(run_dir / "config.yaml").health.bad_node_ttl_hours
        except Exception:  # the record is best effort; the exclusion above is what matters
            ttl = 0.0
        badnodes.record(blamed, f"{cause}: {detail}", ttl, f"run {run_dir.name}")
    return cause, blamed, detail


def main() -> int:  # pragma: no cover - exercised through jobhooks
    from ddlaunch.slurm.client import SlurmClient

    return preflight_hook(Path(os.environ["DDLAUNCH_RUN_DIR"]), SlurmClient())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
