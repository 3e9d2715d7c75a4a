"""Time lost per interruption: an unmodified HF Trainer script beside Session code, one run.

Both train on the dev cluster as 2 nodes x 1 rank, 0.2 s per step, and are interrupted the
way Slurm interrupts them ahead of the time limit:

* Session (``ddlaunch.examples.mlp`` through ``benchmarks/byo_entry.py``): USR2 to the step's
  tasks (``--signal=USR2@lead``); the ranks save at the next step boundary and rank 0
  requeues;
* HF Trainer (``ddlaunch/examples/hf_trainer.py``, ``trainer.kind: hf``,
  ``--enable_jit_checkpoint``): USR2 to the batch shell (``--signal=B:USR2@lead``); the trap
  forwards TERM, HF saves its jit checkpoint and exits 0, the end hook requeues.

Measured for each, ``--repeat`` times: the wall time from the signal to the first step
printed after the resume (rank 0's log, polled every 50 ms), and the steps recomputed (the
last step the first attempt printed minus the step resumed from). Target: HF within 1.2x
of Session, and zero steps recomputed when the trainer saves on the signal.

    flock /tmp/ddlaunch-devcluster.lock python benchmarks/bench_byo.py --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = """defaults: [clusters/devcluster]
job: {{name: {name}, time: "00:10:00"}}
nodes: {{count: 2, gpus_per_node: 1, cpus_per_task: 2}}
"""
SESSION = (
    COMMON
    + """launch: {{entrypoint: "byo_entry:session_main", backend: gloo, workdir: {bench}}}
fault_tolerance: {{checkpoint_every_steps: 25, keep_last: 0}}
params: {{steps: {steps}, step_sleep: 0.2, lr: 0.05, batch_size: 64, seed: 0}}
"""
)
HF = (
    COMMON
    + """launch:
  script: {repo}/ddlaunch/examples/hf_trainer.py
  args: [--output_dir, "{{checkpoint_dir}}", --max_steps, "{steps}", --save_steps, "25",
         --step_sleep, "0.2", --enable_jit_checkpoint]
  backend: gloo
  env: {{HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1"}}
trainer: {{kind: hf}}
"""
)
STEP_LINE = re.compile(r"^step (\d+)$", re.M)
RANK_HEADER = "[ddlaunch] rank 0/"


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def attempts_text(log: Path) -> list[str]:
    """rank 0's log split into its attempts (each starts with the rank's header line)."""
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [part for part in text.split(RANK_HEADER)[1:]]


def steps(text: str) -> list[int]:
    return [int(s) for s in STEP_LINE.findall(text)]


def interrupt(kind: str, tmp: Path, steps_total: int, at: int) -> tuple[float, int, int]:
    """One run: (seconds from the signal to the first step after the resume, steps
    recomputed, step resumed from)."""
    template = SESSION if kind == "session" else HF
    tmp.mkdir(parents=True)
    cfg = tmp / f"{kind}.yaml"
    cfg.write_text(
        template.format(name=f"byo-{kind}", steps=steps_total, repo=REPO, bench=REPO / "benchmarks")
    )
    out = sh(sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--run-root", str(tmp))
    job, run = out.split()[3], tmp / out.split()[1]
    log = run / "logs" / "rank-0.out"
    try:
        while not (parts := attempts_text(log)) or not steps(parts[0]) or steps(parts[0])[-1] < at:
            time.sleep(0.05)
        if kind == "session":
            sh("scancel", "--signal=USR2", job)  # to the step's tasks, as --signal=USR2@lead
        else:
            sh("scancel", "--batch", "--signal=USR2", job)  # to the shell, as B:USR2@lead
        signalled = time.time()
        while True:
            parts = attempts_text(log)
            if len(parts) > 1 and steps(parts[1]):
                first_after = time.time() - signalled
                break
            if time.time() - signalled > 300:
                raise SystemExit(f"{kind}: no resume within 300 s; see {run}")
            time.sleep(0.05)
        records = json.loads((run / "attempts.json").read_text())
        resumed = records[-1]["resumed_from"] or 0
        recomputed = steps(parts[0])[-1] - resumed
        # Where the time went: the first attempt closed (requeue), the next one started.
        closed, started = records[0]["end"] - signalled, records[-1]["start"] - signalled
        print(f"  {kind}: attempt closed +{closed:.1f} s ({records[0]['cause']}), next attempt "
              f"started +{started:.1f} s, first step +{first_after:.1f} s", flush=True)  # fmt: skip
    finally:
        subprocess.run(
            [sys.executable, "-m", "ddlaunch", "cancel", str(run)], check=False, capture_output=True
        )
        time.sleep(3)
        subprocess.run(["scancel", job], check=False)
    return first_after, recomputed, resumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--at", type=int, default=30, help="signal once rank 0 passed this step")
    args = parser.parse_args()
    os.environ.setdefault("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")) if p
    )
    results: dict[str, list[tuple[float, int, int]]] = {"session": [], "hf": []}
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="bench-byo-", dir=str(Path.home())))
        if os.environ.get("BENCH_KEEP") != "1":
            stack.callback(shutil.rmtree, tmp, True)
        for i in range(args.repeat):
            for kind in ("session", "hf"):  # interleaved: both see the same machine load
                got = interrupt(kind, tmp / f"{kind}-{i}", 400, args.at)
                results[kind].append(got)
                print(f"{kind:8} run {i}: {got[0]:6.1f} s, {got[1]} steps recomputed "
                      f"(resumed from {got[2]})", flush=True)  # fmt: skip
    median = {k: statistics.median(t for t, _, _ in v) for k, v in results.items()}
    ratio = median["hf"] / median["session"]
    worst_recomputed = max(r for _, r, _ in results["hf"])
    print()
    print(f"{'signal -> first step after resume':36} {'median':>8} {'runs':>24}")
    for kind, label in (("session", "Session (baseline)"), ("hf", "HF Trainer, trainer.kind hf")):
        runs = ", ".join(f"{t:.1f}" for t, _, _ in results[kind])
        print(f"  {label:34} {median[kind]:7.1f}s {runs:>24}")
    print(f"  ratio HF / Session: {ratio:.2f}  target <= 1.2  {'OK' if ratio <= 1.2 else 'MISSED'}")
    print(
        f"steps recomputed: Session {[r for _, r, _ in results['session']]}, "
        f"HF {[r for _, r, _ in results['hf']]}  target 0 for HF  "
        f"{'OK' if worst_recomputed == 0 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
