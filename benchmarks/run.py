"""Benchmark runner: each figure printed beside the baseline it is compared with, in one run.

    python benchmarks/run.py [--repeat 15] [--json]

Figures (median wall time of repeated runs, each in a fresh interpreter):
  cli   `ddlaunch --help` and `ddlaunch render examples/mlp`, beside `python -c pass` and
        `python -c "import submitit"` (target: at most 150 ms, and torch never imported).
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


def cli_figures(repeat: int) -> list[dict[str, object]]:
    py = sys.executable
    # The console script installed beside this interpreter (not a version-manager shim on
    # PATH, which would add its own start-up); otherwise the same code through -m.
    entry = Path(py).parent / "ddlaunch"
    ddl = [str(entry)] if entry.exists() else [py, "-m", "ddlaunch"]
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": tempfile.mkdtemp(prefix="ddl-bench-")}
    baseline_pass = median_ms([py, "-c", "pass"], repeat, env)
    baseline_submitit = median_ms([py, "-c", "import submitit"], repeat, env)
    rows = []
    for name, argv in (
        ("ddlaunch --help", [*ddl, "--help"]),
        ("ddlaunch render examples/mlp", [*ddl, "render", "examples/mlp"]),
    ):
        ms = median_ms(argv, repeat, env)
        rows.append(
            {
                "what": name,
                "median_ms": round(ms, 1),
                "target_ms": 150,
                "python -c pass": round(baseline_pass, 1),
                "import submitit": round(baseline_submitit, 1),
                "ok": ms <= 150,
            }
        )
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
    print(
        f"{'command':32} {'median':>9} {'target':>8} {'python -c pass':>15} {'import submitit':>16}"
    )
    for r in rows:
        print(
            f"{r['what']:32} {r['median_ms']:>7.1f}ms {r['target_ms']:>6}ms "
            f"{r['python -c pass']:>13.1f}ms {r['import submitit']:>14.1f}ms"
            f"  {'OK' if r['ok'] else 'SLOW'}"
        )


if __name__ == "__main__":
    main()
