"""The control plane's books of a crashed attempt as the job grows: 16, 160, 1,600 and 16,000
ranks (8 per node). The end hook, timed in-process, with the Slurm commands it ran and the
files it created; then ``ddlaunch status RUN`` and ``ddlaunch report RUN`` on the run
directory the end hook left, each timed as the command a user runs (a fresh process, median
of ``-n``) and traced with ``strace -f`` for the files it opens, creates and renames in the
run directory and the fsyncs it makes; each measure's growth exponent (the log-log slope over
the sizes) beside floors measured in the same run: listing the run directory once
(``os.walk``), which any per-rank work costs at least, reading the batch log, and
``ddlaunch --help`` (the interpreter and the CLI, which every command pays). Without strace
on the PATH the counts are left out. Slurm is never reached: the commands run with a PATH
whose ``squeue``, ``sacct``, ``scontrol`` and ``sinfo`` answer nothing, and SLURM_CONF names
no file.

    python benchmarks/bench_control_plane.py [-n 3] [--ranks 16,160,1600,16000]

Each run directory is built with the project's own writers: the resolved config of
examples/mlp, a committed step 20, one heartbeat record per node (``store.heartbeats``) and
the watchdog's summary and step sample of them (``job.watchdog``), a
failure record for each of the culprit's node peers (``store.failures``; they raised a
peer's collateral error), the start hook's attempt (``job.hooks.start``, which records the
batch log's offset) in a batch log that already holds an earlier attempt's reports, then the
crashed step as srun 22.05 writes it with ``--kill-on-bad-exit``: rank 5 SIGKILLed, every
other task's ``Terminated`` in the teardown, one line per task. Slurm is the unit tests'
``FakeRunner`` answering with the recorded formats (every node ``allocated``; slurmd's
port is a socket here that accepts every connection, so each probe answers).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.fakes import FakeRunner  # noqa: E402

from ddlaunch.config.validate import load_config, to_plain  # noqa: E402
from ddlaunch.job import hooks  # noqa: E402
from ddlaunch.job.watchdog import _Watch  # noqa: E402
from ddlaunch.policy.heartbeats import Thresholds  # noqa: E402
from ddlaunch.runner import CommandResult  # noqa: E402
from ddlaunch.slurm.client import SlurmClient  # noqa: E402
from ddlaunch.store import failures, heartbeats  # noqa: E402
from ddlaunch.store.attempts import AttemptId  # noqa: E402

PER_NODE = 8
JOB = AttemptId("77", 0, "77")
CULPRIT = 5


def node_of(rank: int) -> str:
    return f"node{rank // PER_NODE + 1}"


def srun_step(ranks: int, culprit: int) -> str:
    """The crashed step's part of the batch log (the lines of the recorded
    ``tests/fixtures/slurm-22.05/batch-kill-requeue.out``, one per task)."""
    lines = [f"rank {r}: step 41 loss 2.3" for r in range(0, ranks, 7)]
    lines += [
        f"srun: error: {node_of(culprit)}: task {culprit}: Killed",
        f"srun: launch/slurm: _step_signal: Terminating StepId={JOB.job_id}.0",
        f"slurmstepd-node1: error: *** STEP {JOB.job_id}.0 ON node1 CANCELLED AT x ***",
    ]
    lines += [
        f"srun: error: {node_of(r)}: task {r}: Terminated" for r in range(ranks) if r != culprit
    ]
    lines.append(f"srun: Force Terminated StepId={JOB.job_id}.0")
    return "\n".join(lines) + "\n"


def fake_slurm(nodes: int, port: int) -> FakeRunner:
    states = "".join(f"node{n}|allocated\n" for n in range(1, nodes + 1))

    def addresses(argv: tuple[str, ...]) -> CommandResult:
        shown = "".join(f"NodeName={n} NodeAddr=127.0.0.1\n" for n in argv[-1].split(","))
        return CommandResult(argv, 0, shown, "")

    return FakeRunner(
        {
            "sinfo": states,
            "scontrol show config": f"SlurmdPort = {port}\n",
            "scontrol show node": addresses,
            "scontrol show job": f"JobId={JOB.job_id} JobState=RUNNING Restarts=0\n",
            "sacct": f"{JOB.job_id}.0|CANCELLED|0:15|node[1-{nodes}]\n",
        }
    )


def build(where: Path, ranks: int, config: str, port: int) -> Path:
    run = where / f"run-{ranks}"
    step = run / "checkpoints" / "step-20"
    step.mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "config.yaml").write_text(config)
    (step / ".metadata").write_text("x")
    marker = '{"format": 1, "step": 20, "time": 1.0, "world_size": 1, "num_shard_files": 1}'
    (step / ".ddlaunch-commit.json").write_text(marker)
    now = time.time()
    heartbeats.heartbeat_dir(run).mkdir(parents=True)
    for node in range(max(ranks // PER_NODE, 1)):
        host = node_of(node * PER_NODE)
        records = [beat(rank, host, now) for rank in range(node * PER_NODE, (node + 1) * PER_NODE)]
        path = heartbeats.node_heartbeat_path(run, host)
        heartbeats.write_node_record(path, host, (JOB.job_id, 0, 0), now, records)
    for rank in range(PER_NODE):
        if rank != CULPRIT:
            failures.write_failure(
                run,
                rank,
                {
                    "rank": rank,
                    "host": node_of(rank),
                    "job_id": JOB.job_id,
                    "attempt": 0,
                    "time": now,
                    "exception": "RuntimeError",
                    "message": "Connection closed by peer [10.77.0.11]:63116",
                },
            )
    log = run / "logs" / f"batch-{JOB.job_id}.out"
    # An earlier attempt's reports above this attempt's start: they must not count.
    log.write_text(srun_step(ranks, culprit=ranks - 1))
    nodes = max(ranks // PER_NODE, 1)
    nodelist = f"node[1-{nodes}]"
    env = {"SLURM_JOB_ID": JOB.job_id, "SLURM_JOB_NODELIST": nodelist}
    settings = hooks.HookSettings(ranks_per_node=PER_NODE, nodes=nodes)
    with contextlib.redirect_stdout(None):  # the hook's line goes to the batch log, not here
        hooks.start(run, SlurmClient(fake_slurm(nodes, port)), JOB, env, settings)
    with open(log, "a") as handle:
        handle.write(f"[ddlaunch] attempt 0 on {nodelist}, resuming from step 20\n")
        handle.write(srun_step(ranks, CULPRIT))
    # The watchdog's summary for status and its step sample for report, of those beats.
    watch = _Watch(run, JOB, Thresholds(600, 10, 2.0, 300), ranks, SlurmClient(FakeRunner()), now)
    watch.record(now, watch.beats())
    return run


def beat(rank: int, host: str, now: float) -> dict[str, object]:
    """A rank's heartbeat as its writer leaves it (``worker.heartbeat``), at step 41."""
    return {
        "rank": rank,
        "leader": rank % PER_NODE == 0,
        "host": host,
        "pid": 1000 + rank,
        "job_id": JOB.job_id,
        "restart": 0,
        "relaunch": 0,
        "started": now - 600,
        "state": "running",
        "step": 41,
        "step_wall": now - 2,
        "step_time": 0.5,
        "busy_time": 0.4,
        "beat": now - 1,
    }


def files_under(run: Path) -> set[str]:
    return {str(Path(d) / f) for d, _, names in os.walk(run) for f in names}


def end_once(template: Path, scratch: Path, ranks: int, port: int) -> tuple[float, int, int, str]:
    """(seconds, Slurm commands, files created, culprit); the ended run is left in
    ``scratch/run``."""
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(template, run)
    before = files_under(run)
    nodes = max(ranks // PER_NODE, 1)
    runner = fake_slurm(nodes, port)
    settings = hooks.HookSettings(ranks_per_node=PER_NODE, nodes=nodes)
    with contextlib.redirect_stdout(None):
        began = time.perf_counter()
        hooks.end(run, 137, SlurmClient(runner), JOB, settings)
        took = time.perf_counter() - began
    created = len(files_under(run) - before)
    culprit = str(hooks.attempts.load(run)[-1].culprit)
    return took, len(runner.calls), created, culprit


def list_once(template: Path) -> float:
    began = time.perf_counter()
    sum(len(names) for _, _, names in os.walk(template))
    return time.perf_counter() - began


def read_once(template: Path) -> float:
    """The other floor: reading the batch log line by line, parsing nothing."""
    began = time.perf_counter()
    with open(template / "logs" / f"batch-{JOB.job_id}.out", "rb") as handle:
        sum(1 for _ in handle)
    return time.perf_counter() - began


def no_slurm(where: Path) -> dict[str, str]:
    """The environment of the commands: Slurm's commands answer nothing, none is reached."""
    bin_dir = where / "no-slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("squeue", "sacct", "scontrol", "sinfo", "sbatch", "srun", "scancel"):
        script = bin_dir / name
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    env.update(SLURM_CONF=str(where / "no-slurm.conf"), NO_COLOR="1", COLUMNS="120")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def command(run: Path, verb: str) -> list[str]:
    """``ddlaunch VERB RUN`` (``report`` writes into the run directory, its default)."""
    return [sys.executable, "-m", "ddlaunch", verb, str(run)]


def time_command(argv: list[str], env: dict[str, str], n: int) -> float:
    """The median wall time of ``n`` runs of the command, each a fresh process, after one
    untimed run (the bytecode and page caches warm, as for a user's second command)."""
    times = []
    for i in range(n + 1):
        began = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if i:
            times.append(time.perf_counter() - began)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[3:]} failed: {proc.stderr[-2000:]}")
    return statistics.median(times)


TRACED = "openat,open,creat,rename,renameat,renameat2,fsync,fdatasync"


def count_calls(argv: list[str], env: dict[str, str], run: Path, where: Path) -> dict[str, int]:
    """Files of the run directory the command opens, creates (opens with O_CREAT) and renames
    into, and every fsync/fdatasync it makes, from ``strace -f``; {} without strace."""
    if shutil.which("strace") is None:
        return {}
    trace = where / "strace.txt"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", f"trace={TRACED}", "-o", str(trace), *argv],
        env=env,
        capture_output=True,
        check=False,
    )
    counts = {"opens": 0, "creates": 0, "renames": 0, "fsyncs": 0}
    inside = f'"{run}/'
    for line in trace.read_text(errors="replace").splitlines():
        if re.search(r"\b(f|fdata)sync\(", line):
            counts["fsyncs"] += 1
        elif re.search(r"\brename(at2?)?\(", line):
            counts["renames"] += inside in line
        elif inside in line and re.search(r"\b(open|openat|creat)\(", line):
            counts["opens"] += 1
            counts["creates"] += "O_CREAT" in line or "creat(" in line
    return counts


def slope(xs: list[int], ys: list[float]) -> float:
    """The least-squares slope of log y on log x (y ~ x^slope); 0 for a constant."""
    pts = [(math.log(x), math.log(max(y, 1e-9))) for x, y in zip(xs, ys, strict=True)]
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    num = sum((x - mx) * (y - my) for x, y in pts)
    return num / sum((x - mx) ** 2 for x, _ in pts)


def answer_forever(server: socket.socket) -> None:
    """slurmd as a probe sees a living one: every connection accepted (and closed)."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:  # closed at the end of the run
            return
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="ends timed per size (median)")
    parser.add_argument("--ranks", default="16,160,1600,16000")
    args = parser.parse_args()
    sizes = [int(r) for r in args.ranks.split(",")]
    config = yaml.safe_dump(to_plain(load_config("examples/mlp")))
    measures: dict[str, list[float]] = {"end": [], "list": [], "read": []}
    commands: list[float] = []
    created: list[float] = []
    verbs = ("status", "report")
    cli: dict[str, list[float]] = {v: [] for v in verbs}
    calls: dict[str, list[dict[str, int]]] = {v: [] for v in verbs}
    help_s = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="bench-control-plane-") as tmp,
        socket.socket() as slurmd,
    ):
        slurmd.bind(("127.0.0.1", 0))
        slurmd.listen(256)
        threading.Thread(target=answer_forever, args=(slurmd,), daemon=True).start()
        port = slurmd.getsockname()[1]
        base = Path(tmp)
        os.environ["DDLAUNCH_BAD_NODES"] = str(base / "bad.json")
        head = ("ranks", "end hook", "list dir", "read log", "Slurm cmds", "files")
        print("{:>6} {:>10} {:>10} {:>10} {:>10} {:>6}  culprit".format(*head))
        for ranks in sizes:
            template = build(base, ranks, config, port)
            ends = [end_once(template, base, ranks, port) for _ in range(args.n)]
            took = statistics.median(e[0] for e in ends)
            listed = statistics.median(list_once(template) for _ in range(args.n))
            read = statistics.median(read_once(template) for _ in range(args.n))
            measures["end"].append(took)
            measures["list"].append(listed)
            measures["read"].append(read)
            commands.append(ends[-1][1])
            created.append(ends[-1][2])
            print(
                f"{ranks:>6} {took * 1000:>8.1f}ms {listed * 1000:>8.1f}ms {read * 1000:>8.1f}ms "
                f"{ends[-1][1]:>10} {ends[-1][2]:>6}  {ends[-1][3]}",
                flush=True,
            )
            ended, env = base / "run", no_slurm(base)
            for verb in verbs:
                argv = command(ended, verb)
                cli[verb].append(time_command(argv, env, args.n))
                calls[verb].append(count_calls(argv, env, ended, base))
            help_s = time_command([sys.executable, "-m", "ddlaunch", "--help"], env, args.n)
            shutil.rmtree(template)
    print(
        f"\nddlaunch status RUN / report RUN on the ended run (median of {args.n}; floor: "
        f"ddlaunch --help {help_s * 1000:.0f} ms, the last size):"
    )
    print(
        "{:>6} {:>8} {:>6} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7} {:>7} {:>6}".format(
            "ranks",
            "status",
            "opens",
            "creates",
            "renames",
            "fsyncs",
            "report",
            "opens",
            "creates",
            "renames",
            "fsyncs",
        )
    )
    for i, ranks in enumerate(sizes):
        row = [f"{ranks:>6}"]
        for verb in verbs:
            c = calls[verb][i]
            row.append(f"{cli[verb][i] * 1000:>6.0f}ms")
            row += [
                f"{c.get(k, '-'):>{w}}"
                for k, w in (("opens", 6), ("creates", 7), ("renames", 7), ("fsyncs", 6))
            ]
        print(" ".join(row))
    print("growth exponent (log-log slope over the sizes; 1 = linear in ranks, 0 = constant):")
    print(f"  end hook time      {slope(sizes, measures['end']):5.2f}")
    print(f"  floor: list dir    {slope(sizes, measures['list']):5.2f}")
    print(f"  floor: read log    {slope(sizes, measures['read']):5.2f}")
    print(f"  Slurm commands     {slope(sizes, commands):5.2f}")
    print(f"  files created      {slope(sizes, created):5.2f}")
    for verb in verbs:
        print(f"  {verb + ' time':<18} {slope(sizes, cli[verb]):5.2f}")
        if calls[verb][0]:
            for key in ("opens", "creates", "fsyncs"):
                values = [float(max(c[key], 1)) for c in calls[verb]]
                print(f"  {verb + ' ' + key:<18} {slope(sizes, values):5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
