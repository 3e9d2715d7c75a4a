"""Plan validation + placement for a 2,000-node, 16,000-GPU job, beside the validation of the
same config without a parallel: section, in one run (pure: no cluster needed).

    python benchmarks/bench_parallel_plan.py [--repeat 21]

Both configs are YAML files on disk, composed with the dgx-h100 preset (8 GPUs, NVSwitch,
8 NDR adapters). Timed, in this process after a warm-up (the login node's ``render`` /
``submit`` do the same once per command): loading and validating the config (the degrees
resolved and checked against the job's shape: ``config.parallel``), then the placement
(``planning.parallel.parallel_plan``) and everything ``render`` prints about it (the
dimension table, the per-node lines, the communication estimate). Baseline: loading and
validating the same config without ``parallel:``. Target: validation + placement < 50 ms.
For scale, enumerating every group of every dimension, which the plan never does, is timed
too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlaunch.config.load import load_tree
from ddlaunch.config.validate import validate_tree
from ddlaunch.planning import describe
from ddlaunch.planning.parallel import parallel_plan

BASE = """defaults: [clusters/dgx-h100]
job: {name: llm-16k}
nodes: {count: 2000, gpus_per_node: 8}
launch: {entrypoint: pkg.train:main}
"""
PARALLEL = """parallel:
  dp: auto
  dp_replicate: 250
  tp: 8
  pp: 1
  model_params: 7e10
  hidden_size: 8192
  layers: 80
  tokens_per_step: 16777216
"""


def median_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float, float]:
    fn()  # warm-up: imports, caches
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        planned, plain = Path(tmp) / "planned.yaml", Path(tmp) / "plain.yaml"
        planned.write_text(BASE + PARALLEL)
        plain.write_text(BASE)
        cfg = validate_tree(load_tree(planned))
        plan = parallel_plan(cfg)
        print(f"config: {plan.world} ranks on {plan.nodes} nodes x {plan.ranks_per_node}, "
              f"mesh {dict(zip(plan.names, plan.shape, strict=True))}")  # fmt: skip

        def validate_planned() -> object:
            return validate_tree(load_tree(planned))

        def place() -> object:
            return describe.parallel_lines(cfg)

        def both() -> object:
            return describe.parallel_lines(validate_tree(load_tree(planned)))

        def baseline() -> object:
            return validate_tree(load_tree(plain))

        def every_group() -> object:
            return sum(len(g) for d in plan.names for g in plan.groups(d))

        rows = [
            ("baseline: load + validate, no parallel:", baseline),
            ("load + validate with parallel:", validate_planned),
            ("placement + what render prints", place),
            ("validation + placement (target < 50 ms)", both),
            ("for scale: every group of every dim", every_group),
        ]
        results = {}
        for label, fn in rows:
            results[label] = median_ms(fn, args.repeat)
            med, lo, hi = results[label]
            print(f"{label:<44} {med:8.2f} ms  (min {lo:.2f}, max {hi:.2f}; {args.repeat} runs)")
        base = results[rows[0][0]][0]
        total = results[rows[3][0]][0]
        verdict = "met" if total < 50 else "MISSED"
        print(f"validation + placement: {total:.2f} ms = {total / base:.2f}x the baseline "
              f"(+{total - base:.2f} ms); target < 50 ms: {verdict}")  # fmt: skip
        print("\n".join(describe.parallel_lines(cfg)[:12]))


if __name__ == "__main__":
    main()
