"""Pipeline overhead on the dev cluster: the time from a stage's end (its entry point's work
done) to its dependent's first step (past its first all-reduce), for a two-stage
``ddlaunch pipeline`` beside a hand-written chain of two sbatch scripts, the second
submitted with ``--dependency=afterok:<first>``, each running the same entry point with
plain srun + python. 1 node x 1 rank per stage, gloo; rounds alternate, in one run.
Target (issue #26): ddlaunch at most 1.1x the hand-written chain.

    SLURM_CONF=/etc/ddlaunch-devcluster/slurm.conf python benchmarks/bench_pipeline.py [-n 5]

Where the gap goes is read from the entry points' records (benchmarks/pipeline_entry.py),
the controller's and the node's Slurm logs (millisecond times, when readable; else
``sacct``'s whole seconds) and ddlaunch's own records (the attempt's end as the end hook
wrote it, the dependent's preflight). Everything runs under a temporary directory, with
its own run root and bad-node list; every job submitted is cancelled on the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENTRY = HERE / "pipeline_entry.py"
TIMEOUT_S = 240.0

HANDWRITTEN = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:05:00
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \\
  WORLD_SIZE=$SLURM_NTASKS exec {python} -u {entry} {which} {out}'
"""

STAGE = """defaults: [clusters/devcluster]
job: {{time: "00:05:00"}}
nodes: {{count: 1, gpus_per_node: 1, cpus_per_task: 1}}
health: {{preflight: {preflight}}}
launch: {{entrypoint: "pipeline_entry:{function}", workdir: "{here}", backend: gloo,
         snapshot: {snapshot}, env: {{BENCH_OUT: "{out}"}}}}
"""

PIPELINE = """name: bench-pipeline
stages:
  first: {config: first.yaml}
  second: {config: second.yaml, after: first}
"""

HAND = "hand-written afterok chain"
DDL = "ddlaunch pipeline (default)"
DDL_NOPRE = "ddlaunch pipeline, no preflight"

Round = dict[str, float]  # one round's times (absolute wall times, seconds)


class Slurm:
    """Every job this run submitted, and the Slurm logs its breakdown reads."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.jobs: list[str] = []
        config = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, check=True
        ).stdout
        found = dict(re.findall(r"^(\w+)\s+= (.*)$", config, re.M))
        self.interval = found.get("SchedulerParameters", "?")
        self.ctld_log = Path(found.get("SlurmctldLogFile", "/nonexistent"))
        self.slurmd_log = found.get("SlurmdLogFile", "/nonexistent")
        self.ctld_offset = self.ctld_log.stat().st_size if readable(self.ctld_log) else -1
        self.nodes: dict[str, str] = {}

    def sbatch(self, *args: str) -> str:
        job = subprocess.run(
            ["sbatch", "--parsable", *args], capture_output=True, text=True, check=True
        ).stdout.strip()
        self.jobs.append(job)
        return job

    def queued(self, jobs: Iterable[str]) -> bool:
        ids = ",".join(jobs)
        out = subprocess.run(
            ["squeue", "-h", "-j", ids, "-o", "%i"], capture_output=True, text=True, check=False
        ).stdout
        return bool(out.strip())

    def cancel_all(self) -> None:
        """Cancel what this run submitted: the jobs it knows, and any job whose script lies
        under its temporary directory (submitted by an interrupted ``ddlaunch pipeline``)."""
        listing = subprocess.run(
            ["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, check=False
        ).stdout
        mine = {
            line.split("|", 1)[0]
            for line in listing.splitlines()
            if "|" in line and line.split("|", 1)[1].startswith(str(self.tmp))
        }
        left = sorted((set(self.jobs) & queued_ids(listing)) | mine)
        if left:
            subprocess.run(["scancel", *left], check=False, capture_output=True)
            deadline = time.time() + 30
            while time.time() < deadline and self.queued(left):
                time.sleep(0.5)

    def ctld_events(self) -> dict[tuple[str, str], float]:
        """(what, job) -> time from the controller's log since this run began: ``complete``
        (the batch script's exit status reached it), ``started`` (the job was allocated);
        remembers each started job's nodes for :meth:`batch_launched`."""
        if self.ctld_offset < 0:
            return {}
        with self.ctld_log.open("rb") as f:
            f.seek(self.ctld_offset)
            text = f.read().decode(errors="replace")
        events: dict[tuple[str, str], float] = {}
        for stamp, job in re.findall(
            r"^\[(\S+)\] _job_complete: JobId=(\d+) WEXITSTATUS", text, re.M
        ):
            events[("complete", job)] = log_time(stamp)
        for m in re.finditer(
            r"^\[(\S+)\] sched\S*: (?:_start_job: Started JobId=(\d+) in \S+ on (\S+)"
            r"|Allocate JobId=(\d+) NodeList=(\S+))",
            text,
            re.M,
        ):
            job = m.group(2) or m.group(4)
            events[("started", job)] = log_time(m.group(1))
            events[("backfill", job)] = float(m.group(2) is not None)
            self.nodes[job] = m.group(3) or m.group(5)
        return events

    def batch_launched(self, job: str) -> float | None:
        """When the node's slurmd launched the job's batch script (its log)."""
        node = self.nodes.get(job)
        if node is None:
            return None
        path = Path(self.slurmd_log.replace("%n", node).replace("%h", node))
        if not readable(path):
            return None
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 256 * 1024))
            text = f.read().decode(errors="replace")
        found = re.findall(rf"^\[(\S+)\] Launching batch job {job} ", text, re.M)
        return log_time(found[-1]) if found else None

    def sacct(self, jobs: Iterable[str]) -> dict[str, tuple[float, float]]:
        """job -> (Start, End) as accounting has them, whole seconds."""
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,Start,End"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        times: dict[str, tuple[float, float]] = {}
        for line in out.splitlines():
            job, start, end = line.split("|")
            try:
                times[job] = (sacct_time(start), sacct_time(end))
            except ValueError:
                continue
        return times

    def step_cpu(self, job: str) -> dict[str, float]:
        """step -> its TotalCPU (s) as accounting has it: ``batch`` (the batch script and
        what it runs besides srun), ``0`` (the ranks' step)."""
        out = subprocess.run(
            ["sacct", "-n", "-P", "-j", job, "-o", "JobID,TotalCPU"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        found: dict[str, float] = {}
        for line in out.splitlines():
            step, total = line.split("|")
            if "." in step and total:
                found[step.split(".", 1)[1]] = cpu_seconds(total)
        return found


def cpu_seconds(total: str) -> float:
    """sacct's TotalCPU ([D-][HH:]MM:SS[.mmm]) in seconds."""
    days, _, clock = total.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


def readable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.R_OK)


def queued_ids(listing: str) -> set[str]:
    return {line.split("|", 1)[0] for line in listing.splitlines() if line}


def log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def sacct_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()


def wait_for(path: Path, what: str, timeout: float = TIMEOUT_S) -> dict[str, float]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file():
            record: dict[str, float] = json.loads(path.read_text())
            return record
        time.sleep(0.1)
    raise TimeoutError(f"{what}: no {path} after {timeout:.0f} s")


def wait_gone(slurm: Slurm, jobs: list[str]) -> None:
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline and slurm.queued(jobs):
        time.sleep(0.2)


def common(out: Path, slurm: Slurm, first: str, second: str) -> Round:
    """The times both sides have: the entry points' records and Slurm's."""
    end = wait_for(out / "end.json", f"job {first}")
    start = wait_for(out / "start.json", f"job {second}")
    wait_gone(slurm, [first, second])
    row: Round = {
        "work_end": end["work_end"],
        "process_start": start["process_start"],
        "entered": start["entered"],
        "imported": start["imported"],
        "first_step": start["first_step"],
        "cpu_entered": start["cpu_entered"],
        "cpu_first_step": start["cpu_first_step"],
    }
    events = slurm.ctld_events()
    if ("complete", first) in events and ("started", second) in events:
        row["job_complete"] = events[("complete", first)]
        row["job_started"] = events[("started", second)]
        row["by_backfill"] = events[("backfill", second)]
        launched = slurm.batch_launched(second)
        if launched is not None:
            row["batch_launched"] = launched
    accounting = slurm.sacct([first, second])
    if first in accounting and second in accounting:
        row["sacct_end"] = accounting[first][1]
        row["sacct_start"] = accounting[second][0]
    for step, cpu in slurm.step_cpu(second).items():
        row[f"cpu_{step}"] = cpu
    return row


def run_handwritten(tmp: Path, slurm: Slurm, i: int) -> Round:
    out = tmp / f"hand-{i}"
    scripts = {}
    for which in ("end", "start"):
        scripts[which] = tmp / f"hand-{i}-{which}.sbatch"
        scripts[which].write_text(
            HANDWRITTEN.format(python=sys.executable, entry=ENTRY, which=which, out=out)
        )
    log = f"--output={tmp}/hand-{i}-%j.log"
    first = slurm.sbatch(log, str(scripts["end"]))
    second = slurm.sbatch(log, f"--dependency=afterok:{first}", str(scripts["start"]))
    return common(out, slurm, first, second)


def run_ddlaunch(tmp: Path, slurm: Slurm, i: int, preflight: bool, snapshot: str) -> Round:
    tag = f"ddl-{i}-{'pre' if preflight else 'nopre'}"
    out = tmp / tag
    folder = tmp / tag / "files"
    folder.mkdir(parents=True)
    for name, function in (("first", "stage_end"), ("second", "stage_start")):
        (folder / f"{name}.yaml").write_text(
            STAGE.format(
                preflight=str(preflight).lower(),
                function=function,
                here=HERE,
                snapshot=snapshot,
                out=out,
            )
        )
    (folder / "pipeline.yaml").write_text(PIPELINE)
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "pipeline", str(folder / "pipeline.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    submitted = re.findall(r"^stage (\w+)  run (\S+)  job (\d+)", proc.stdout, re.M)
    jobs = {name: job for name, _run, job in submitted}
    runs = {name: run for name, run, _job in submitted}
    slurm.jobs.extend(jobs.values())
    if proc.returncode != 0 or set(jobs) != {"first", "second"}:
        raise SystemExit(
            f"ddlaunch pipeline failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
        )
    row = common(out, slurm, jobs["first"], jobs["second"])
    root = Path(os.environ["DDLAUNCH_RUN_ROOT"])
    attempts = json.loads((root / runs["first"] / "attempts.json").read_text())
    row["end_hook_recorded"] = attempts[-1]["end"]
    second = root / runs["second"]
    row["start_hook_recorded"] = json.loads((second / "attempts.json").read_text())[0]["start"]
    gates = sorted((second / "health").glob("gate-*.json"))
    if gates:
        row["gate_passed"] = json.loads(gates[0].read_text())["time"]
    preflight_record = second / "health" / "preflight.json"
    if preflight_record.is_file():
        found = re.search(r"torch \S+ imported in ([\d.]+) s", preflight_record.read_text())
        if found:
            row["torch_import_s"] = float(found.group(1))
    return row


# The gap, split where the records allow: (label, from, to). A row is shown for a side when
# its rounds have both times; the first step is where the dependent's torch import falls
# for the hand-written chain (for ddlaunch the preflight did it before the entry point).
SEGMENTS: list[tuple[str, str, str]] = [
    ("stage 1 work end -> end hook recorded the attempt", "work_end", "end_hook_recorded"),
    ("end hook recorded -> job end (controller log)", "end_hook_recorded", "job_complete"),
    ("stage 1 work end -> job end (controller log)", "work_end", "job_complete"),
    ("job end -> dependent allocated (controller log)", "job_complete", "job_started"),
    ("allocated -> batch script launched (slurmd log)", "job_started", "batch_launched"),
    ("batch script -> rank process started", "batch_launched", "process_start"),
    ("batch script -> start hook recorded the attempt", "batch_launched", "start_hook_recorded"),
    ("rank process started -> preflight gate passed", "process_start", "gate_passed"),
    ("rank process started -> entry point called", "process_start", "entered"),
    ("entry point -> torch imported", "entered", "imported"),
    ("torch imported -> first step (group, all-reduce)", "imported", "first_step"),
    ("job end -> dependent's start, sacct (whole s)", "sacct_end", "sacct_start"),
]
# CPU seconds of the dependent (not wall time): its rank process up to the entry point and
# up to the first step (its own rusage), and its job's steps as sacct has them.
CPU_ROWS: list[tuple[str, str]] = [
    ("CPU: rank process up to the entry point", "cpu_entered"),
    ("CPU: rank process up to the first step", "cpu_first_step"),
    ("CPU: the ranks' step (sacct, whole step)", "cpu_0"),
    ("CPU: batch step (sacct: script, hooks, watchdog)", "cpu_batch"),
]


def median_span(rows: list[Round], start: str, end: str) -> float | None:
    """Median of ``end - start`` over the rounds that have both times."""
    values = [row[end] - row[start] for row in rows if start in row and end in row]
    return statistics.median(values) if values else None


def report(results: dict[str, list[Round]], loads: list[float], slurm: Slurm) -> None:
    gaps = {
        side: [row["first_step"] - row["work_end"] for row in rows]
        for side, rows in results.items()
    }
    base = statistics.median(gaps[HAND])
    print(
        f"\n{'stage end -> first step of dependent':36} {'median':>8} {'min-max':>13} {'ratio':>6}"
    )
    for side, values in gaps.items():
        med = statistics.median(values)
        print(
            f"{side:36} {med:>7.2f}s {min(values):>6.2f}-{max(values):<6.2f} {med / base:>5.2f}x"
            f"  runs {' '.join(f'{v:.2f}' for v in values)}"
        )
    own = {
        side: [
            row["first_step"] - row["work_end"] - (row["job_started"] - row["job_complete"])
            for row in rows
            if "job_started" in row
        ]
        for side, rows in results.items()
    }
    if all(own.values()):
        own_base = statistics.median(own[HAND])
        print(
            "the same without Slurm's release and allocation (job end -> dependent allocated, "
            "which waits for the scheduler's next pass), median: "
            + ", ".join(
                f"{side} {statistics.median(v):.2f}s ({statistics.median(v) / own_base:.2f}x)"
                for side, v in own.items()
            )
        )
    entered = {
        side: statistics.median(row["entered"] - row["work_end"] for row in rows)
        for side, rows in results.items()
    }
    print(
        "stage end -> dependent's entry point called, median: "
        + ", ".join(f"{side} {value:.2f}s" for side, value in entered.items())
    )
    print("\nwhere it goes (median of each part, s)")
    width = max(len(label) for label, _, _ in SEGMENTS)
    names = {HAND: "hand", DDL: "ddlaunch", DDL_NOPRE: "no preflight"}
    print(f"{'':{width}} " + " ".join(f"{names[side]:>12}" for side in results))
    for label, start, end in SEGMENTS:
        cells = [median_span(rows, start, end) for rows in results.values()]
        if all(cell is None for cell in cells):
            continue
        shown = " ".join(f"{'-' if c is None else f'{c:.3f}':>12}" for c in cells)
        print(f"{label:{width}} {shown}")
    for label, key in CPU_ROWS:
        per_side = [[row[key] for row in rows if key in row] for rows in results.values()]
        if not any(per_side):
            continue
        shown = " ".join(f"{f'{statistics.median(v):.3f}' if v else '-':>12}" for v in per_side)
        print(f"{label:{width}} {shown}")
    backfill = {
        names[side]: sum(row["by_backfill"] for row in rows if "by_backfill" in row)
        for side, rows in results.items()
    }
    print(
        "dependents started by the backfill pass (else by the main scheduler at the job end): "
        + ", ".join(f"{name} {count:.0f}" for name, count in backfill.items())
    )
    torch = [row["torch_import_s"] for row in results[DDL] if "torch_import_s" in row]
    if torch:
        print(
            f"(ddlaunch's preflight: torch imported in {statistics.median(torch):.1f} s, "
            "median of its records)"
        )
    if slurm.ctld_offset < 0:
        print("(the controller's log is not readable here: Slurm's parts from sacct only)")
    print(
        f"\nscheduler: {slurm.interval}; load average (1 min) at each round's start "
        f"{min(loads):.2f}-{max(loads):.2f}; {len(gaps[HAND])} rounds"
    )
    print(
        f"target: ddlaunch <= 1.1x the hand-written chain: "
        f"{'met' if statistics.median(gaps[DDL]) <= 1.1 * base else 'MISSED'} "
        f"({statistics.median(gaps[DDL]) / base:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=5, help="rounds (default 5)")
    parser.add_argument(
        "--snapshot",
        choices=("git", "copy", "none"),
        default="git",
        help="launch.snapshot of the stages (default git; made at submission, not in the gap)",
    )
    args = parser.parse_args()
    os.environ.setdefault("SLURM_CONF", "/etc/ddlaunch-devcluster/slurm.conf")
    signal.signal(signal.SIGTERM, stop)  # like Ctrl-C: through the finally that cancels
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-", dir=str(Path.home())))
    os.environ["DDLAUNCH_RUN_ROOT"] = str(tmp / "runs")
    os.environ["DDLAUNCH_BAD_NODES"] = str(tmp / "bad_nodes.json")
    slurm = Slurm(tmp)
    print(f"scheduler: {slurm.interval}; {os.uname().nodename}: {uptime()}")
    sides: list[tuple[str, Callable[[int], Round]]] = [
        (HAND, lambda i: run_handwritten(tmp, slurm, i)),
        (DDL, lambda i: run_ddlaunch(tmp, slurm, i, True, args.snapshot)),
        (DDL_NOPRE, lambda i: run_ddlaunch(tmp, slurm, i, False, args.snapshot)),
    ]
    results: dict[str, list[Round]] = {side: [] for side, _ in sides}
    loads: list[float] = []
    try:
        for i in range(args.n):
            order = sides if i % 2 == 0 else sides[::-1]  # alternating: same load on each side
            for side, run in order:
                loads.append(os.getloadavg()[0])
                row = run(i)
                results[side].append(row)
                gap = row["first_step"] - row["work_end"]
                print(f"round {i + 1}/{args.n} {side:34} {gap:6.2f}s", flush=True)
        print(f"end: {uptime()}")
        report(results, loads, slurm)
    finally:
        slurm.cancel_all()
        shutil.rmtree(tmp, ignore_errors=True)


def stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


if __name__ == "__main__":
    main()
