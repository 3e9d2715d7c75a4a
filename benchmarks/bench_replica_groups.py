"""Replica groups vs the whole-job restart on the dev cluster, under one failure schedule.

Both runs train the example MLP on 4 ranks (2 nodes x 2 ranks, gloo, ``step_sleep`` 0.15 s,
a checkpoint every 20 steps) with 3 nodes allocated (``spare_nodes: 1``), and take the
``bench_spares.py schedule`` failures at fixed wall times after the first step: kill -9 a
rank at +60 s, every process of a working node (never the batch host) at +130 s, kill -9 a
rank at +200 s (a later injection waits for the run to train again):

* ``mode: job``: today's fastest path, every rank restarts in the allocation, on the spare
  after the node death;
* ``mode: replica_groups``, ``parallel.dp_replicate: 2``: one group per node; a failure
  restarts its group alone, the other keeps training, the restarted group heals from it.

Each rank records when it started each step (``tests/launch_entrypoints.py:mlp_step_times``).
Goodput = samples trained into committed steps / (wall time x the uninterrupted samples per
second), the wall from the first step to the last; in job mode that is the ETTR of
``bench_spares.py``. Also, per failure: the surviving group's longest pause between two
steps (its stall) and the steps it ran again, and kill -> the failed group back in the
quorum; and the median step time of each run (the quorum's cost with no failure).

    flock /tmp/ddlaunch-devcluster.lock python benchmarks/bench_replica_groups.py [--steps N]

Targets (issue "replica groups"): goodput >= 95 %, survivors' stall <= 1 s, steps lost by
the survivors <= 1 per failure, the quorum <= 5 % slower per step than job mode.
``BENCH_KEEP=1`` keeps the run directories.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import itertools

from bench_recovery import rank_pids, sh
from bench_spares import (
    DEVCLUSTER,
    SCHEDULE,
    finish,
    kill_node,
    node_state,
    wait_idle,
    working_victim,
)

TESTS = Path(__file__).resolve().parents[1] / "tests"
STEPS = 1600
STEP_SLEEP = 0.15
BATCH = 64  # per rank
CONFIG = """defaults: [clusters/devcluster]
job: {{name: {name}, time: "00:20:00"}}
nodes: {{count: 2, gpus_per_node: 2, cpus_per_task: 1}}
launch: {{entrypoint: "launch_entrypoints:mlp_step_times", workdir: "{tests}", backend: gloo}}
fault_tolerance: {{checkpoint_every_steps: 20, keep_last: 0, spare_nodes: 1{extra}}}
health: {{preflight: false, heartbeat_interval: 1.0}}
params: {{steps: {steps}, step_sleep: {sleep}, batch_size: {batch}, log_every: 0}}
{more}"""


def submit(tmp: Path, name: str, replica: bool, steps: int) -> tuple[str, Path]:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        CONFIG.format(
            name=name,
            tests=TESTS,
            extra=", mode: replica_groups" if replica else "",
            steps=steps,
            sleep=STEP_SLEEP,
            batch=BATCH,
            more="parallel: {dp_replicate: 2}\n" if replica else "",
        )
    )
    os.environ["DDLAUNCH_BAD_NODES"] = str(tmp / f"{name}-bad-nodes.json")
    out = sh(sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--run-root", str(tmp))
    return out.split()[3], tmp / out.split()[1]


def lines(run: Path, rank: int) -> list[tuple[float, int]]:
    path = run / "out" / f"steps-{rank}.txt"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            found.append((float(parts[0]), int(parts[1])))
    return found


def committed(points: list[tuple[float, int]], final: int | None) -> set[int]:
    """Steps this rank started and finished: a step followed by the next one (a step run
    again after a failed commit, or abandoned by a crash, is not), plus the final step."""
    done = {a[1] for a, b in itertools.pairwise(points) if b[1] == a[1] + 1}
    if final is not None and points and points[-1][1] == final - 1:
        done.add(final - 1)
    return done


def group_restarts(run: Path) -> list[dict]:
    try:
        records = json.loads((run / "attempts.json").read_text())
    except (OSError, ValueError):
        return []
    return [g for a in records for g in a.get("group_restarts") or ()]


def trains_since(run: Path, since: float) -> bool:
    """Every group (or, in job mode, rank 0) started a step after ``since``."""
    return all(p and p[-1][0] > since for p in (lines(run, 0), lines(run, 2)))


def one_run(tmp: Path, replica: bool, steps: int, keep: bool) -> dict:
    name = "rg-groups" if replica else "rg-job"
    job, run = submit(tmp, name, replica, steps)
    injected: list[tuple[float, str]] = []
    dead: list[str] = []
    reviving: subprocess.Popen | None = None
    try:
        deadline = time.time() + 300
        while not lines(run, 0):
            if time.time() > deadline or (run / "outcome.json").exists():
                raise SystemExit(f"{name}: no first step")
            time.sleep(0.2)
        t0 = lines(run, 0)[0][0]
        pending = list(SCHEDULE)
        last = 0.0
        while not (run / "outcome.json").exists():
            now = time.time()
            if now - t0 > 1500:
                raise SystemExit(f"{name}: not done after 25 min")
            if dead and reviving is None and "DOWN" in node_state(dead[0]):
                reviving = subprocess.Popen([str(DEVCLUSTER), "up"], stdout=subprocess.DEVNULL)
            if reviving is not None and reviving.poll() is not None:
                reviving, dead = None, dead[1:]
            if pending and now - t0 >= pending[0][0] and trains_since(run, last + 1.0):
                at, what = pending.pop(0)
                last = time.time()
                if what == "rank":
                    pid = rank_pids(run)[-1]
                    os.kill(pid, signal.SIGKILL)
                    done = f"kill -9 rank pid {pid}"
                else:
                    victim, _ = working_victim(run)
                    kill_node(victim)
                    dead.append(victim)
                    done = f"kill node {victim}"
                injected.append((last, what))
                print(f"  {name}: +{last - t0:6.1f} s (due +{at:.0f}) {done}", flush=True)
            time.sleep(0.1)
        outcome = json.loads((run / "outcome.json").read_text())
        return measure(run, name, replica, steps, t0, injected, outcome)
    finally:
        if reviving is not None:
            reviving.wait()
        finish(run, job, keep)
        if keep:
            print(f"  kept {run}", flush=True)


def measure(
    run: Path,
    name: str,
    replica: bool,
    steps: int,
    t0: float,
    injected: list[tuple[float, str]],
    outcome: dict,
) -> dict:
    heads = (0, 2) if replica else (0,)
    per_group_batch = BATCH * (2 if replica else 4)
    points = {r: lines(run, r) for r in heads}
    end = max(p[-1][0] for p in points.values())
    gaps = [
        b[0] - a[0] for p in points.values() for a, b in itertools.pairwise(p) if b[1] == a[1] + 1
    ]
    per_step = statistics.median(gaps)
    samples = sum(len(committed(p, steps)) for p in points.values()) * per_group_batch
    rate = BATCH * 4 / per_step  # every rank training, uninterrupted
    wall = end + per_step - t0
    stalls, again = [], []
    for killed, _ in injected:
        # Per head, its longest pause around the kill and its steps run again; the survivor
        # is the head that paused least (in job mode the only head: the restart).
        seen = []
        for p in points.values():
            near = [
                (a, b)
                for a, b in itertools.pairwise(p)
                if killed - 1 <= b[0] and a[0] <= killed + 15
            ]
            if near:
                pause = max(b[0] - a[0] for a, b in near)
                seen.append((pause, sum(1 for a, b in near if b[1] <= a[1])))
        if seen:
            pause, rerun = min(seen)
            stalls.append(round(pause, 2))
            again.append(rerun)
    restarts = group_restarts(run)
    result = {
        "name": name,
        "state": outcome.get("state"),
        "goodput": samples / (wall * rate),
        "per_step": per_step,
        "wall": wall,
        "stalls": stalls,
        "again": again,
        "rejoin": [g.get("rejoin_s") for g in restarts],
        "restarts": [
            f"group {g['group']}: {g.get('cause')} -> {g.get('decision')}" for g in restarts
        ],
    }
    print(f"  {name}: {json.dumps(result)}", flush=True)
    return result


def main() -> None:
    os.environ.setdefault("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf")
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else STEPS
    keep = os.environ.get("BENCH_KEEP") == "1"
    tmp = Path(tempfile.mkdtemp(prefix="bench-rg-", dir=str(Path.home())))
    try:
        runs = {}
        for replica in (True, False):
            wait_idle()
            runs[replica] = one_run(tmp, replica, steps, keep)
    finally:
        if not keep:
            shutil.rmtree(tmp, True)
    g, j = runs[True], runs[False]
    print(f"Under the schedule {', '.join(f'+{t:.0f} s {w}' for t, w in SCHEDULE)}, {steps} steps:")
    for r in (g, j):
        print(
            f"  {r['name']:10} {r['state']}: goodput {r['goodput']:7.2%} ({r['wall']:.1f} s wall, "
            f"median step {r['per_step']:.3f} s)"
        )
    print(
        f"  replica groups: survivors' longest pause per failure {g['stalls']} s, steps run "
        f"again {g['again']}, kill -> group back in the quorum {g['rejoin']} s"
    )
    print(f"  quorum cost per step: {g['per_step'] / j['per_step'] - 1:+.1%} against mode: job")
    print(
        f"  goodput ratio {g['goodput'] / j['goodput']:.3f}x mode: job; target >= 95 %: "
        f"{'OK' if g['goodput'] >= 0.95 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
