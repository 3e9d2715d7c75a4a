"""Benchmark runner: each figure printed beside the baseline it is compared with, in one run.

    python benchmarks/run.py [--repeat 15] [--json]

Figures (median wall time of repeated runs, each in a fresh interpreter):
  cli   `ddlaunch --help` and `ddlaunch render examples/mlp`, beside `python -c pass`,
        `python -c "import submitit"` and the floor of each command: the import of the
        libraries it cannot do without (click; click + PyYAML + Jinja2 for render).
        Target: at most 150 ms, and torch never imported.
Other benchmark modules under benchmarks/ are run when their dependencies are available.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_ms(argv: list[str], repeat: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(
            argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


# What every run of a command pays before ddlaunch's own code: the interpreter, and the
# libraries the command cannot do without (click parses every command line; render also
# reads YAML and renders Jinja2). Printed beside the commands as their floor.
BASELINES = {
    "--help": ("python -c 'import click'", "import click"),
    "render": ("python -c 'import click, yaml, jinja2'", "import click, yaml, jinja2"),
}
TARGET_MS = 150


def cli_figures(repeat: int) -> list[dict[str, object]]:
    py = sys.executable
    # The console script installed beside this interpreter (not a version-manager shim on
    # PATH, which would add its own start-up); otherwise the same code through -m.
    entry = Path(py).parent / "ddlaunch"
    ddl = [str(entry)] if entry.exists() else [py, "-m", "ddlaunch"]
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": tempfile.mkdtemp(prefix="ddl-bench-")}
    common = {
        "python -c pass": median_ms([py, "-c", "pass"], repeat, env),
        "python -c 'import submitit'": median_ms([py, "-c", "import submitit"], repeat, env),
    }
    rows = []
    for name, argv, kind in (
        ("ddlaunch --help", [*ddl, "--help"], "--help"),
        ("ddlaunch render examples/mlp", [*ddl, "render", "examples/mlp"], "render"),
    ):
        ms = median_ms(argv, repeat, env)
        floor_name, floor_code = BASELINES[kind]
        floor = median_ms([py, "-c", floor_code], repeat, env)
        rows.append(
            {
                "what": name,
                "median_ms": round(ms, 1),
                "target_ms": TARGET_MS,
                "floor": floor_name,
                "floor_ms": round(floor, 1),
                "ok": ms <= TARGET_MS,
            }
        )
    rows.append({"baselines_ms": {k: round(v, 1) for k, v in common.items()}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = cli_figures(args.repeat)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    *commands, baselines = rows
    print(f"median of {args.repeat} runs, each a fresh process")
    print(f"{'command':30} {'median':>9} {'target':>8}   floor (same run)")
    for r in commands:
        print(
            f"{r['what']:30} {r['median_ms']:>7.1f}ms {r['target_ms']:>6}ms   "
            f"{r['floor']} {r['floor_ms']:.1f}ms  {'OK' if r['ok'] else 'SLOW'}"
        )
    for name, ms in baselines["baselines_ms"].items():
        print(f"{name:30} {ms:>7.1f}ms")


if __name__ == "__main__":
    main()
