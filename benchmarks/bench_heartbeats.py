"""The watchdog's cycle at 16 -> 16,000 ranks: the per-rank heartbeat layout of earlier
versions, the node record of the version before (one JSON object: every rank decoded each
cycle) and the node record with its summary (a head line per node: ranks decoded only for a
suspect node), in one run.

    PYTHONPATH=. python benchmarks/bench_heartbeats.py [--nodes 2,20,200,2000] [--repeat 5]
        [--open-latency-ms 1.0]

For each size (nodes x 8 ranks), one interval of synthetic beats of a healthy attempt is
written with the ranks' own writer (``worker.heartbeat.Heartbeat``: node-local records, the
leader's merge) into one run directory, and the same records as ``rank-<R>.json`` files and
as the previous version's ``node-<host>.json`` into two others. Printed per layout: the
files written to the shared filesystem per interval, the files one watchdog cycle opens, the
cycle's wall time on this disk (``job.watchdog.watch`` with one poll: read, summarise,
analyse; best of ``--repeat``) and its CPU time (the same cycle's process time: what the
cycle costs without the waits of a loaded machine), and the wall time with
``--open-latency-ms`` added per open: a model of Lustre or GPFS, where opening a small file
costs ~1 ms at the metadata server (added arithmetically, not slept). Also the straggler
rule at the largest size, beside the quadratic rule it replaced, and each layout's growth
exponents (the log-log slope over the sizes: 1 = linear in ranks). Runs without the dev
cluster.
"""

from __future__ import annotations

import argparse
import builtins
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_control_plane import slope  # the benchmarks' own directory is on the path
from support import beats as synth
from support.fakes import FakeRunner

from ddlaunch.job.watchdog import watch
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import heartbeats as store
from ddlaunch.store.attempts import AttemptId

PER_NODE = 8
T = analysis.Thresholds(
    hang_timeout=600, heartbeat_interval=10, straggler_factor=2.0, straggler_patience=300
)
ATTEMPT = AttemptId(synth.JOB, synth.RESTART, synth.JOB)


class Counter:
    """Counts opens (through the store's ``open``) and renames into one directory."""

    def __init__(self) -> None:
        self.opens = 0
        self.renames = 0
        self.shared = ""

    def __enter__(self) -> Counter:
        real_open, real_replace = builtins.open, os.replace

        def counting_open(file, *args, **kw):  # type: ignore[no-untyped-def]
            self.opens += 1
            return real_open(file, *args, **kw)

        def counting_replace(src, dst):  # type: ignore[no-untyped-def]
            self.renames += bool(self.shared) and os.fspath(dst).startswith(self.shared)
            real_replace(src, dst)

        self._restore = (real_open, real_replace)
        store.open = counting_open  # type: ignore[attr-defined]
        store.os.replace = counting_replace  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        del store.open  # type: ignore[attr-defined]
        store.os.replace = self._restore[1]


def cycle(run_dir: Path, now: float, repeat: int) -> tuple[float, float, int]:
    """(best wall time of one watchdog cycle, best CPU time, files it opened)."""
    times, cpu = [], []
    opens = 0
    for _ in range(repeat):
        with Counter() as counter:
            started, began = time.perf_counter(), time.process_time()
            watch(
                run_dir,
                attempt=ATTEMPT,
                thresholds=T,
                expected_ranks=None,
                srun_pid=None,
                client=SlurmClient(FakeRunner()),
                clock=lambda: now,
                sleep=lambda s: None,
                max_polls=1,
            )
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - began)
        opens = counter.opens
    return min(times), min(cpu), opens


def write_previous_layout(run_dir: Path, recs: list[dict[str, Any]]) -> None:
    """The node record of the version before: one JSON object per node, its ranks in a
    list, no summary (``node-<host>.json``; still read)."""
    hosts: dict[str, list[dict[str, Any]]] = {}
    for rec in recs:
        hosts.setdefault(rec["host"], []).append(rec)
    directory = store.heartbeat_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for host, ranks in hosts.items():
        head = {"host": host, "job_id": synth.JOB, "restart": synth.RESTART, "relaunch": 0}
        record = {**head, "beat": time.time(), "ranks": ranks}
        store.write_heartbeat(directory / f"{store.NODE_PREFIX}{host}.json", record)


def quadratic_slow_nodes(busy: dict[str, float], factor: float) -> dict[str, float]:
    out = {}
    for host, mine in busy.items():
        others = statistics.median(v for h, v in busy.items() if h != host)
        if others > 0 and mine > factor * others:
            out[host] = mine / others
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,20,200,2000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--open-latency-ms", type=float, default=1.0)
    args = parser.parse_args()
    latency = args.open_latency_ms / 1000
    sizes = [int(n) for n in args.nodes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="bench-heartbeats-"))
    print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs; disk {root}")
    print(
        f"{'ranks':>6} {'layout':>13} {'shared writes/interval':>22} {'opens/cycle':>11} "
        f"{'cycle local':>11} {'cpu':>7} {'+' + str(args.open_latency_ms) + ' ms/open':>14}"
    )
    grown: dict[str, list[tuple[float, float, float]]] = {}
    try:
        for nodes in sizes:
            now = time.time()
            recs = synth.records(nodes, PER_NODE, now)
            node_run, rank_run = root / f"node-{nodes}", root / f"rank-{nodes}"
            previous_run = root / f"previous-{nodes}"
            writers = synth.writers(node_run, root / f"tmp-{nodes}", recs, PER_NODE)
            with Counter() as counter:
                counter.shared = str(store.heartbeat_dir(node_run))
                synth.beat_all(writers)
                node_writes = counter.renames
            with Counter() as counter:
                counter.shared = str(store.heartbeat_dir(rank_run))
                synth.write_rank_layout(rank_run, recs)
                rank_writes = counter.renames
            write_previous_layout(previous_run, recs)
            for layout, run, writes in (
                ("per-rank", rank_run, rank_writes),
                ("per-node", previous_run, node_writes),
                ("node summary", node_run, node_writes),
            ):
                seconds, cpu, opens = cycle(run, now, args.repeat)
                grown.setdefault(layout, []).append((seconds, cpu, opens))
                print(
                    f"{nodes * PER_NODE:>6} {layout:>13} {writes:>22} {opens:>11} "
                    f"{seconds:>10.3f}s {cpu:>6.3f}s {seconds + opens * latency:>13.3f}s",
                    flush=True,
                )
            for run in (node_run, rank_run, previous_run):
                shutil.rmtree(run, ignore_errors=True)
        ranks = [nodes * PER_NODE for nodes in sizes]
        if len(sizes) > 1:
            print("growth exponent (cycle local, cpu, opens):")
            for layout, rows in grown.items():
                wall, cpu, opens = (slope(ranks, [r[i] for r in rows]) for i in range(3))
                print(f"  {layout:>13}: {wall:5.2f} {cpu:5.2f} {opens:5.2f}")
        n = max(sizes)
        busy = analysis.node_busy_times([analysis.Beat.from_record(r) for r in recs])
        for name, rule in (("quadratic", quadratic_slow_nodes), ("sorted", analysis.slow_nodes)):
            started = time.perf_counter()
            rule(busy, 2.0)
            print(f"straggler rule, {n} nodes, {name}: {time.perf_counter() - started:.4f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
