"""Hot spares on the dev cluster: recovery from a node death, and ETTR under failures.

``node-death`` (``--repeat N``): the example MLP (2 nodes x 2 ranks, gloo, 0.15 s per step,
checkpoint every 20 steps); at step >= 60 every process of the second working node (never the
batch host) is killed -9. Measured: kill -> the next attempt's first finished step (rank 0's
``timings.jsonl``) and kill -> detection, with ``fault_tolerance.spare_nodes: 1`` (3 nodes
allocated, the watchdog's verdict ``time``) beside the requeue path (no spare: Slurm requeues
the job when it marks the node DOWN, the detection that counts there), runs interleaved,
medians and their ratios. The killed node is revived after each run and the next run waits
until every node is idle. Targets: first step on the spare <= 20 s, detection <= 5 s p95.

    flock /tmp/ddlaunch-devcluster.lock python benchmarks/bench_spares.py node-death --repeat 3

``schedule``: effective training time ratio under one failure schedule, injected at fixed wall
times after attempt 0's first step (a later injection waits for the run to train again): at
60 s kill -9 one rank, at 130 s kill every process of the second working node, at 200 s kill -9
one rank. One run with recovery in the allocation (``spare_nodes: 1``, default
``max_restarts``), one requeue-only (``max_restarts: 0``, no spare), one with the in-process
restart beside the spare (``restart: in_process``, ``standbys_per_node: 1``: each rank kill
is taken by its node's standby, which forks the rank and waits again; the node kill, slurmd
included, moves the node's ranks to the spare's standbys), same schedule.
ETTR = steps completed x the median step time of the run's uninterrupted stretches (rank 0's
save points of one attempt: every 20 steps) / the wall time from attempt 0's first step to
the last step. Target >= 90 % in the allocation.

    flock /tmp/ddlaunch-devcluster.lock python benchmarks/bench_spares.py schedule
    SBATCH_PARTITION=lane3 python benchmarks/bench_spares.py schedule --only spare,inprocess

``overhead`` (``--repeat N``, ``--steps S``): what the in-process restart costs a run that
never fails: the same MLP for S steps (default 600) with the default restart (new
processes), with ``restart: in_process`` (standbys, the state copied to RAM every
``memory_every_steps`` = 5 steps and at each save, the peer copies in the background), and
with ``restart: in_process, memory_every_steps: 0`` (copies at saves only); runs
interleaved, each one's median step time between rank 0's save points, medians over the
rounds and their ratios to the default's. Target: <= 3 % slower per step.

    SBATCH_PARTITION=lane3 python benchmarks/bench_spares.py overhead --repeat 2

On a dev cluster shared with others, ``SBATCH_PARTITION`` keeps the runs in one lane: only its
nodes are waited for, and only the nodes the benchmark killed are revived
(``scripts/devcluster revive NODE``).
Each run gets its own bad-node list (``DDLAUNCH_BAD_NODES``), so a node blamed here stays off
no later submission. ``BENCH_KEEP=1`` keeps the run directories (logs, attempts.json).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
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
import bench_recovery
from bench_recovery import first_steps, node_state, progress, rank_pids, sh, stop_run

INTERVAL = 20
DEVCLUSTER = Path(__file__).resolve().parents[1] / "scripts" / "devcluster"
CONFIG = """defaults: [clusters/devcluster]
job: {{name: {name}, time: "{limit}"}}
nodes: {{count: 2, gpus_per_node: 2, cpus_per_task: 1}}
launch: {{entrypoint: "ddlaunch.examples.mlp:main", backend: gloo}}
fault_tolerance: {{checkpoint_every_steps: {interval}, keep_last: 0{extra}}}
params: {{steps: {steps}, step_sleep: 0.15}}
"""
# The schedule: (seconds after attempt 0's first step, what fails).
SCHEDULE = ((60.0, "rank"), (130.0, "node"), (200.0, "rank"))
# ~5 minutes of training: 0.189 s per step (median) measured by this benchmark's node-death
# runs (0.15 s sleep + the step + a save every 20 steps, 2 nodes x 2 ranks on the 2-core VM).
SCHEDULE_STEPS = 1600


# ---------------------------------------------------------------------- the cluster


def submit(tmp: Path, name: str, extra: str, steps: int, limit: str) -> tuple[str, Path]:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        CONFIG.format(name=name, limit=limit, interval=INTERVAL, extra=extra, steps=steps)
    )
    # A bad-node list of its own (sbatch exports it to the job): a node this run blames
    # must not be kept off the next run's submission.
    os.environ["DDLAUNCH_BAD_NODES"] = str(tmp / f"{name}-bad-nodes.json")
    out = sh(sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--run-root", str(tmp))
    return out.split()[3], tmp / out.split()[1]


def attempts(run: Path) -> list[dict]:
    try:
        return json.loads((run / "attempts.json").read_text())
    except (FileNotFoundError, ValueError):
        return []


def hostnames(hostlist: str) -> list[str]:
    return sh("scontrol", "show", "hostnames", hostlist).split() if hostlist else []


def working_victim(run: Path) -> tuple[str, dict]:
    """The current attempt's second working node that is not the batch host (losing the
    batch host ends the job), and that attempt's record."""
    current = attempts(run)[-1]
    used = hostnames(current.get("nodes", ""))
    others = [n for n in used if n != current.get("host")]
    if len(used) < 2 or not others:
        raise SystemExit(f"no working node to kill besides the batch host: {current}")
    return (used[1] if used[1] in others else others[0]), current


def kill_node(node: str) -> int:
    """SIGKILL every process in the node's network namespace (slurmd, slurmstepd, ranks)."""
    KILLED.add(node)
    killed = 0
    for pid in sh("ip", "netns", "pids", f"ddl-{node}").split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    return killed


def revive(nodes: list[str]) -> None:
    """``scripts/devcluster revive NODE...``: restarts the slurmd of the nodes this benchmark
    killed and resumes them; no other node is touched (the cluster is shared)."""
    if nodes:
        subprocess.run(
            [str(DEVCLUSTER), "revive", *nodes], check=False, capture_output=True, timeout=180
        )


KILLED: set[str] = set()  # the nodes this benchmark killed, revived when found down


def lane_nodes() -> list[str]:
    """The nodes of the partition the runs go to (``SBATCH_PARTITION``, e.g. a lane of the
    dev cluster), else every node."""
    part = os.environ.get("SBATCH_PARTITION")
    return sh("sinfo", "-h", "-N", *(["-p", part] if part else []), "-o", "%N").split()


def wait_gone(job: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
        if not out.stdout.strip():
            return
        subprocess.run(["scancel", job], check=False)
        time.sleep(1)
    print(f"  (job {job} still in squeue after {timeout:.0f} s)", flush=True)


def wait_idle(timeout: float = 180) -> None:
    """Until every node of the runs' partition is IDLE (a node this benchmark killed
    revived, the job's epilogs done)."""
    nodes = lane_nodes()
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {n: node_state(n) for n in nodes}
        if all(s == "IDLE" for s in states.values()):
            return
        revive([n for n, s in states.items() if n in KILLED and ("DOWN" in s or "DRAIN" in s)])
        time.sleep(1)
    raise SystemExit(f"nodes not idle after {timeout:.0f} s: {states}")


def finish(run: Path, job: str, keep: bool) -> None:
    stop_run(run, job)
    wait_gone(job)
    revive(sorted(KILLED))
    wait_idle()
    if not keep:
        shutil.rmtree(run, True)


def wait_step(run: Path, step: int, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while progress(run).get("step", -1) < step:
        if (run / "outcome.json").exists() or time.time() > deadline:
            raise SystemExit(f"no step {step}: {attempts(run)}")
        time.sleep(0.2)


def verdict_time(run: Path, record: dict) -> float | None:
    """When the watchdog's verdict on an attempt was written (its ``time``)."""
    key = f"{record['job_id']}-{record.get('restart_count', 0)}"
    key += f".{record['relaunch']}" if record.get("relaunch") else ""
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        return float(json.loads((run / "health" / f"verdict-{key}.json").read_text())["time"])
    return None


def timing_points(run: Path) -> dict[str, list[tuple[float, int]]]:
    """attempt key -> its (time, step) points in rank 0's ``timings.jsonl``: the first
    finished step and each save (every 20 steps), in order."""
    out: dict[str, list[tuple[float, int]]] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in (run / "timings.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                rec = json.loads(line)
                if rec.get("kind") in ("first_step", "save"):
                    point = (float(rec["time"]), int(rec["step"]))
                    out.setdefault(str(rec["attempt"]), []).append(point)
    return {k: sorted(v) for k, v in out.items()}


def step_times(run: Path) -> list[float]:
    """Seconds per step between consecutive points of one attempt (a save included)."""
    out = []
    for points in timing_points(run).values():
        for (t0, s0), (t1, s1) in itertools.pairwise(points):
            if s1 > s0:
                out.append((t1 - t0) / (s1 - s0))
    return out


# ---------------------------------------------------------------------- node death


def one_node_death(tmp: Path, spare: bool, i: int, keep: bool) -> dict:
    name = f"spare-{i}" if spare else f"requeue-{i}"
    job, run = submit(tmp, name, ", spare_nodes: 1" if spare else "", 400, "00:10:00")
    try:
        wait_step(run, 60)
        victim, opened = working_victim(run)
        killed = time.time()
        kill_node(victim)
        down = not_responding = None
        while True:
            now = time.time()
            state = node_state(victim)
            if not_responding is None and ("NOT_RESPONDING" in state or "DOWN" in state):
                not_responding = now - killed
            if down is None and "DOWN" in state:
                down = now - killed
            later = [t for t in first_steps(run) if t > killed]
            if later:
                break
            if (run / "outcome.json").exists() or now - killed > 300:
                raise SystemExit(f"{name}: no recovery: {json.dumps(attempts(run), indent=1)}")
            time.sleep(0.1)
        recovered = min(later) - killed
        records = attempts(run)
        first, second = records[0], records[-1]
        verdict = verdict_time(run, first)
        out = {
            "recovered": recovered,
            "detected": (verdict - killed) if verdict is not None else None,
            "down": down,
            "not_responding": not_responding,
            "victim": victim,
            "cause": first.get("cause"),
            "decision": first.get("decision"),
            "blamed": first.get("blamed"),
            "in_allocation": bool(second.get("in_allocation")),
            "nodes": (hostnames(opened.get("nodes", "")), hostnames(second.get("nodes", ""))),
            "spares": opened.get("spares"),
            "concluded": (first.get("end") or 0) - killed,
            "started": second["start"] - killed,
            "attempts": len(records),
            "step_times": step_times(run),
        }
        odd = check_node_death(out, spare, opened)
        out["odd"] = odd
        if odd:
            print(f"  {name} ODD: {odd}\n  attempts: {json.dumps(records)}", flush=True)
            keep = True
        return out
    finally:
        finish(run, job, keep)
        if keep:
            print(f"  kept {run}", flush=True)


def check_node_death(r: dict, spare: bool, opened: dict) -> list[str]:
    """What the records should say (tests/test_fault_tolerance.py): deviations, if any."""
    odd = []
    if r["cause"] != "node failure" and not (not spare and r["cause"] == "requeued by Slurm"):
        odd.append(f"cause {r['cause']!r}")
    if spare:
        if r["blamed"] != [r["victim"]]:
            odd.append(f"blamed {r['blamed']} (killed {r['victim']})")
        if not r["in_allocation"]:
            odd.append("next attempt not in the allocation")
        before, after = r["nodes"]
        want = [before[0], *(opened.get("spares") or [])]
        if after != want:
            odd.append(f"next attempt on {after}, expected {want}")
        if r["detected"] is None:
            odd.append("no watchdog verdict")
    elif r["in_allocation"]:
        odd.append("requeue path restarted in the allocation")
    return odd


def since(seconds: float | None) -> str:
    """A time after the kill, or that it did not happen before the first step."""
    return f"+{seconds:.1f} s" if seconds is not None else "not yet"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def node_death(repeat: int) -> None:
    keep = os.environ.get("BENCH_KEEP") == "1"
    tmp = Path(tempfile.mkdtemp(prefix="bench-spares-", dir=str(Path.home())))
    results: dict[bool, list[dict]] = {True: [], False: []}
    try:
        wait_idle()
        for i in range(repeat):
            for spare in (True, False):
                r = one_node_death(tmp, spare, i, keep)
                results[spare].append(r)
                how = "spare_nodes: 1" if spare else "requeue       "
                detected = (
                    f"verdict +{r['detected']:.1f} s" if r["detected"] is not None else "no verdict"
                )
                print(
                    f"run {i + 1} {how}: kill {r['victim']} -> first step {r['recovered']:6.2f} s"
                    f" ({detected}; Slurm: not responding {since(r['not_responding'])},"
                    f" DOWN {since(r['down'])}; attempt concluded +{r['concluded']:.1f} s,"
                    f" next started +{r['started']:.1f} s on {','.join(r['nodes'][1])};"
                    f" {r['decision'] or r['cause']})",
                    flush=True,
                )
    finally:
        if not keep:
            shutil.rmtree(tmp, True)
    spare_rec = [r["recovered"] for r in results[True]]
    requeue_rec = [r["recovered"] for r in results[False]]
    verdicts = [r["detected"] for r in results[True] if r["detected"] is not None]
    # The requeue path's detection: Slurm marks the node DOWN, and only then requeues.
    downs = [r["down"] for r in results[False] if r["down"] is not None]
    inside, requeue = statistics.median(spare_rec), statistics.median(requeue_rec)
    steps = [t for r in results[True] + results[False] for t in r["step_times"]]
    print(f"{'node death':40} median of {repeat} (runs interleaved)")
    print(
        f"{'  kill -> first step, on the spare':40} {inside:7.2f} s   target <= 20 s  "
        f"{'OK' if inside <= 20 else 'SLOW'}"
    )
    print(f"{'  kill -> first step, requeue':40} {requeue:7.2f} s")
    print(f"{'  ratio requeue / spare':40} {requeue / inside:7.2f}x")
    if verdicts and downs:
        det, down = statistics.median(verdicts), statistics.median(downs)
        print(
            f"{'  detection: watchdog verdict':40} {det:7.2f} s   p95 {p95(verdicts):.2f} s, "
            f"target p95 <= 5 s  {'OK' if p95(verdicts) <= 5 else 'SLOW'}"
        )
        print(f"{'  detection: Slurm DOWN (requeue path)':40} {down:7.2f} s")
        print(f"{'  ratio DOWN / verdict':40} {down / det:7.2f}x")
    if steps:
        print(f"{'  median step time (both paths)':40} {statistics.median(steps):7.3f} s")
    odd = [r["odd"] for r in results[True] + results[False] if r["odd"]]
    if odd:
        print(f"records that differ from what is expected: {odd}")


# ---------------------------------------------------------------------- failure schedule


def inject(run: Path, what: str, killed_nodes: list[str]) -> str:
    if what == "rank":
        pids = rank_pids(run)
        if not pids:
            raise SystemExit(f"no rank to kill: {attempts(run)}")
        os.kill(pids[-1], signal.SIGKILL)
        return f"kill -9 rank pid {pids[-1]}"
    victim, _ = working_victim(run)
    kill_node(victim)
    killed_nodes.append(victim)
    return f"kill node {victim}"


def training(run: Path, since: float) -> bool:
    """Whether an attempt had its first finished step after ``since`` (the run trains
    again after the last failure)."""
    return any(t > since for t in first_steps(run))


def one_schedule(tmp: Path, spare: bool, steps: int, keep: bool, in_process: bool = False) -> dict:
    name = "sched-inprocess" if in_process else "sched-spare" if spare else "sched-requeue"
    extra = ", spare_nodes: 1" if spare else ", max_restarts: 0"
    if in_process:
        extra += ", restart: in_process"
    job, run = submit(tmp, name, extra, steps, "00:15:00")
    dead: list[str] = []  # killed nodes not revived yet
    injected: list[tuple[float, str]] = []
    reviving: subprocess.Popen | None = None
    try:
        deadline = time.time() + 300
        while not first_steps(run):
            if time.time() > deadline or (run / "outcome.json").exists():
                raise SystemExit(f"{name}: no first step: {attempts(run)}")
            time.sleep(0.2)
        t0 = min(first_steps(run))
        pending = list(SCHEDULE)
        last_fault = 0.0
        while not (run / "outcome.json").exists():
            now = time.time()
            if time.time() - t0 > 1200:
                raise SystemExit(f"{name}: not done after 20 min: {attempts(run)}")
            # A killed node back once Slurm declared it DOWN and the run trains again: the
            # requeued attempt's start hook blames (and excludes) the node only if it is
            # still down then; later failures need 2 live nodes besides it. Not in process:
            # there the ranks' step that named the node runs on, and a node whose slurmd
            # registers again without the step makes slurmctld cancel the whole step
            # (measured: STEP CANCELLED on the live nodes 0.02 s after the revived slurmd
            # started); the later failures kill ranks only, and the node is revived after.
            if (
                dead
                and not in_process
                and reviving is None
                and training(run, last_fault)
                and "DOWN" in node_state(dead[0])
            ):
                reviving = subprocess.Popen(
                    [str(DEVCLUSTER), "revive", dead[0]], stdout=subprocess.DEVNULL
                )
            if reviving is not None and reviving.poll() is not None:
                reviving, dead = None, dead[1:]
            if pending and now - t0 >= pending[0][0] and training(run, last_fault):
                at, what = pending.pop(0)
                last_fault = time.time()
                done = inject(run, what, dead)
                injected.append((last_fault, what))
                print(
                    f"  {name}: +{last_fault - t0:6.1f} s (due +{at:.0f}) {done} at step "
                    f"~{progress(run).get('step')}",
                    flush=True,
                )
            time.sleep(0.1)
        end = progress(run)
        records = attempts(run)
        outcome = json.loads((run / "outcome.json").read_text())
        result = json.loads((run / "result.json").read_text()) if outcome else {}
        per_step = statistics.median(step_times(run))
        begun = timing_points(run)
        first = min(p for pts in begun.values() for p in pts)
        done_steps = steps - first[1]
        wall = end["time"] - t0
        recomputed = recomputed_steps(records, begun, injected, per_step)
        starts = sorted(first_steps(run))
        recovery = [min(t for t in starts if t > k) - k for k, _ in injected]
        print(
            f"  {name}: outcome {outcome.get('state')}, {len(records)} attempts "
            f"({', '.join(describe(r) for r in records)}), result start_step "
            f"{result.get('start_step')}, final step {end.get('step')}",
            flush=True,
        )
        odd = []
        if outcome.get("state") != "COMPLETED" or end.get("step") != steps:
            odd.append(f"outcome {outcome}, progress {end}")
        if spare and any(not r.get("in_allocation") for r in records[1:]):
            odd.append("a retry left the allocation")
        if not spare and any(r.get("in_allocation") for r in records[1:]):
            odd.append("a retry stayed in the allocation with max_restarts 0")
        if odd:
            keep = True
            print(f"  {name} ODD: {odd}\n  attempts: {json.dumps(records)}", flush=True)
        return {
            "ettr": done_steps * per_step / wall,
            "per_step": per_step,
            "wall": wall,
            "steps": done_steps,
            "attempts": len(records),
            "recomputed": recomputed,
            "recovery": recovery,
            "odd": odd,
        }
    finally:
        if reviving is not None:
            reviving.wait()
        finish(run, job, keep)
        if keep:
            print(f"  kept {run}", flush=True)


def describe(record: dict) -> str:
    where = "in allocation" if record.get("in_allocation") else "allocation"
    return f"{where} {record.get('nodes')} from {record.get('resumed_from')}: {record.get('cause')}"


def recomputed_steps(
    records: list[dict],
    points: dict[str, list[tuple[float, int]]],
    injected: list[tuple[float, str]],
    per_step: float,
) -> list[int]:
    """Per failure: the step reached at the kill (the attempt's last timing point before it
    plus the steps since at the median step time) minus the step the next attempt resumed
    from, or the in-process restart that followed the kill."""
    from ddlaunch.store.attempts import key_of

    def record_key(r: dict) -> str:
        return key_of(str(r.get("job_id")), r.get("restart_count") or 0, r.get("relaunch") or 0)

    out = []
    for killed, _ in injected:
        ran = [r for r in records if r["start"] < killed and r.get("end", killed) >= killed]
        after = [r for r in records if r["start"] > killed]
        in_process = [
            r
            for a in ran
            for r in a.get("in_process_restarts") or ()
            if r.get("time", 0) >= killed and r.get("resumed_from") is not None
        ]
        if not ran or not (after or in_process):
            continue
        before = [p for p in points.get(record_key(ran[-1]), []) if p[0] <= killed]
        if not before:
            continue
        t, s = before[-1]
        reached = s + int((killed - t) / per_step)
        resumed = in_process[0] if in_process else after[0]
        out.append(reached - (resumed.get("resumed_from") or 0))
    return out


OVERHEAD_SIDES = (
    ("restart: process (default)", ""),
    ("restart: in_process", ", restart: in_process"),
    ("in_process, memory_every_steps: 0", ", restart: in_process, memory_every_steps: 0"),
)


def overhead(repeat: int, steps: int) -> None:
    keep = os.environ.get("BENCH_KEEP") == "1"
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-", dir=str(Path.home())))
    per_step: dict[str, list[float]] = {label: [] for label, _ in OVERHEAD_SIDES}
    try:
        wait_idle()
        for i, (label, extra) in itertools.product(range(repeat), OVERHEAD_SIDES):
            name = f"overhead-{OVERHEAD_SIDES.index((label, extra))}-{i}"
            job, run = submit(tmp, name, extra, steps, "00:10:00")
            try:
                deadline = time.time() + 600
                while not (run / "outcome.json").exists():
                    if time.time() > deadline:
                        raise SystemExit(f"{name}: not done after 10 min: {attempts(run)}")
                    time.sleep(0.5)
                state = json.loads((run / "outcome.json").read_text()).get("state")
                if state != "COMPLETED" or len(attempts(run)) != 1:
                    raise SystemExit(f"{name}: {state}, {attempts(run)}")
                per_step[label].append(statistics.median(step_times(run)))
                print(f"  {label:36} round {i + 1}: {per_step[label][-1]:.4f} s a step", flush=True)
            finally:
                finish(run, job, keep)
    finally:
        if not keep:
            shutil.rmtree(tmp, True)
    base = statistics.median(per_step[OVERHEAD_SIDES[0][0]])
    print(f"Per-step time with no failure, {steps} steps, median of {repeat} runs")
    for label, _ in OVERHEAD_SIDES:
        mid = statistics.median(per_step[label])
        print(f"  {label:36} {mid:.4f} s a step  {mid / base:.3f}x  ({per_step[label]})")
    worst = max(statistics.median(v) for v in per_step.values()) / base
    print(f"  {'target <= 3 % slower':36} {'OK' if worst <= 1.03 else 'MISSED'}")


def schedule(steps: int, only: str) -> None:
    keep = os.environ.get("BENCH_KEEP") == "1"
    tmp = Path(tempfile.mkdtemp(prefix="bench-spares-", dir=str(Path.home())))
    runs: dict[object, dict] = {}
    try:
        wait_idle()
        chosen = set(only.split(",")) if only else {"spare", "requeue", "inprocess"}
        for spare in (True, False):
            if ("spare" if spare else "requeue") in chosen:
                runs[spare] = one_schedule(tmp, spare, steps, keep)
        if "inprocess" in chosen:
            runs["inprocess"] = one_schedule(tmp, True, steps, keep, in_process=True)
    finally:
        if not keep:
            shutil.rmtree(tmp, True)
    print(
        f"ETTR under the failure schedule {', '.join(f'+{t:.0f} s {w}' for t, w in SCHEDULE)}"
        f", {steps} steps"
    )
    labels = (
        ("inprocess", "in process (restart: in_process)"),
        (True, "in the allocation (spare_nodes: 1)"),
        (False, "requeue only"),
    )
    for spare, label in labels:
        if spare not in runs:
            continue
        r = runs[spare]
        print(
            f"  {label:36} ETTR {r['ettr']:7.2%}  ({r['steps']} steps x {r['per_step']:.3f} s"
            f" / {r['wall']:.1f} s wall), {r['attempts']} attempts, steps recomputed "
            f"{r['recomputed']} = {sum(r['recomputed'])}, kill -> next first step "
            f"{', '.join(f'{t:.1f}' for t in r['recovery'])} s"
        )
    if "inprocess" in runs:
        fast = runs["inprocess"]["ettr"]
        print(f"  {'target >= 97 % in process':36} {'OK' if fast >= 0.97 else 'MISSED'}")
    if True in runs:
        inside = runs[True]["ettr"]
        ratio = (
            f"; ratio {inside / runs[False]['ettr']:.2f}x the requeue-only ETTR"
            if False in runs
            else ""
        )
        print(
            f"  {'target >= 90 % in the allocation':36} "
            f"{'OK' if inside >= 0.9 else 'MISSED'}{ratio}"
        )


def main() -> None:
    os.environ.setdefault("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf")
    mode = sys.argv[1:2]
    if mode == ["node-death"]:
        repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
        node_death(repeat)
    elif mode == ["schedule"]:
        steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 0
        # --only spare|requeue|inprocess, or several with commas: those runs (in that order:
        # spare, requeue, inprocess).
        only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
        schedule(steps or SCHEDULE_STEPS, only)
    elif mode == ["overhead"]:
        repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 2
        steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 600
        overhead(repeat, steps)
    else:
        raise SystemExit(
            "usage: bench_spares.py node-death [--repeat N]"
            " | schedule [--steps N] [--only spare,requeue,inprocess]"
            " | overhead [--repeat N] [--steps N]"
        )


if __name__ == "__main__":
    assert bench_recovery.INTERVAL == INTERVAL  # the same checkpoint cadence as its runs
    main()
