"""The test suite's CPU floor: how long the suite must take on this machine's cores, whatever
runs beside what, from the CPU its processes used.

The suite is CPU-bound on small machines (both cores ~93 % busy in the shared pass), so its wall
time cannot go below ``CPU seconds / cores``. This reads a BSD process-accounting file (Debian's
``acct`` package: ``accton FILE`` before the run, ``accton off`` after; every process that
ended in between, short-lived ranks included, with its CPU time and memory) and prints the total,
the floor, and the share of the processes that imported torch (told apart by their memory: a
torch process maps >= 700 MB), which is where a rank's start-up cost shows.

    apt-get install acct
    accton /tmp/suite.pacct; CI=true bash .ci/run; accton off
    python3 benchmarks/suite_cpu_floor.py /tmp/suite.pacct --cores 2 --wall 2100

Long-running daemons (slurmctld, slurmd) are counted only when they end; their share is small.
"""

from __future__ import annotations

import argparse
import subprocess
from collections import defaultdict
from dataclasses import dataclass

TORCH_MAPPED_MB = 700.0  # a process that imported torch maps at least this much


@dataclass(frozen=True)
class Ended:
    """One accounting record: a process that ended."""

    command: str
    cpu_s: float
    mem_mb: float


def records(pacct: str) -> list[Ended]:
    """``dump-acct``'s lines: command | version | user | system | elapsed | ... | memory (KB)."""
    out = subprocess.run(["dump-acct", pacct], capture_output=True, text=True, check=True).stdout
    ended = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 8:
            continue
        ticks = float(fields[2]) + float(fields[3])  # user + system, in clock ticks (100/s)
        ended.append(Ended(fields[0], ticks / 100, float(fields[7]) / 1024))
    return ended


def kind(e: Ended) -> str:
    python = e.command.startswith(("python", "pt_", "gloo", "torchft"))
    if python:
        return "python, torch imported" if e.mem_mb >= TORCH_MAPPED_MB else "python, no torch"
    return e.command


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pacct", help="the process-accounting file written during the run")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--wall", type=float, help="the run's wall time (s), to print its ratio")
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    ended = records(a.pacct)
    total = sum(e.cpu_s for e in ended)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for e in ended:
        by_kind[kind(e)].append(e.cpu_s)
    floor = total / a.cores
    print(f"{len(ended)} processes, {total:.0f} CPU-s; floor on {a.cores} cores: {floor:.0f} s")
    if a.wall:
        print(f"wall {a.wall:.0f} s = {a.wall / floor:.2f}x the floor")
    for name, times in sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))[: a.top]:
        share = sum(times) / total
        print(f"  {name:<24} {len(times):6d} processes {sum(times):8.0f} CPU-s {share:6.1%}")


if __name__ == "__main__":
    main()
