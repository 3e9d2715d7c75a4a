"""``balance: by_throughput`` against ``balance: none`` on two train components of unlike
speed: RANKS local gloo ranks, the first half the ``fast`` component, the second ``slow``,
whose ranks sleep twice as long per sample (a 2:1 speed ratio, --sleep-ms per sample on the
fast ranks). Both runs train the same model with the Session on the same global batch, one
after the other in one invocation; the figure is the median wall time of a step, rank 0's,
over the steps after the measured ones (balanced) and over the same steps (none).

    PYTHONPATH=.:tests python benchmarks/bench_balance.py --steps 30 --ranks 4

Ideal: the slow ranks set the step time of equal shares (G/world samples at 2 units each);
balanced, every rank computes for 2/3 of that (fast 2G/3 over its ranks at 1 unit, slow G/3
at 2), so 1.5x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks, half fast and half slow")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--measure-steps", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--sleep-ms", type=float, default=5.0, help="per sample, fast ranks")
    args = parser.parse_args()
    from balance_workers import phase_balance
    from ckpt_dist import run_world

    half = args.ranks // 2
    sleep = args.sleep_ms / 1000
    components = f"fast:{half},slow:{args.ranks - half}"
    common = {
        "steps": args.steps,
        "global_batch": args.global_batch,
        "measure_steps": args.measure_steps,
        "sleep_per_sample": {"fast": sleep, "slow": 2 * sleep},
    }
    spec = {
        "components": components,
        "runs": [(mode, {"mode": mode, **common}) for mode in ("none", "by_throughput")],
    }
    with tempfile.TemporaryDirectory() as out:
        run_world(phase_balance, args.ranks, out, spec, timeout=600)
        seen = {
            mode: json.loads(Path(out, f"{mode}-rank0.json").read_text())
            for mode in ("none", "by_throughput")
        }
        recorded = json.loads(Path(out, "by_throughput", "balance.json").read_text())
    steady = slice(args.measure_steps, None)  # after the switch (and the first steps)
    none_s = statistics.median(seen["none"]["step_s"][steady])
    balanced_s = statistics.median(seen["by_throughput"]["step_s"][steady])
    shares = seen["by_throughput"]["shares"]
    parts = {c["name"]: c for c in recorded["components"]}
    print(
        f"{args.ranks} ranks ({components}), global batch {args.global_batch}, "
        f"{args.sleep_ms:g} ms/sample fast, {2 * args.sleep_ms:g} ms/sample slow, "
        f"{args.steps} steps, median of steps {args.measure_steps}..{args.steps - 1}"
    )
    print(
        f"balance: none           {none_s * 1000:7.1f} ms/step  (shares "
        f"{seen['none']['shares'][-1]}/rank everywhere)"
    )
    print(
        f"balance: by_throughput  {balanced_s * 1000:7.1f} ms/step  (shares fast "
        f"{shares[-1]}/rank, slow {parts['slow']['share']}/rank; measured "
        f"{parts['fast']['rate']:.0f} vs {parts['slow']['rate']:.0f} samples/s per rank)"
    )
    print(f"speed-up: {none_s / balanced_s:.2f}x (ideal 1.50x, target >= 1.30x)")


if __name__ == "__main__":
    main()
