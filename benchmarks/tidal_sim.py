"""Simulated time to train a day's samples when extra replica groups fill idle holes, at 1,024
and 16,384 GPUs, against the fixed width.

No cluster: ``policy.tidal_sim`` under both batch policies of ``policy.tidal_batches`` (a fixed
global batch of 32 samples per core group; a fixed batch of 32 per group). Every figure is an
assumption, not a measurement: replica groups of 64 GPUs (8 nodes of 8), a 5 s step, holes of
one group lasting 30 min on average, ``--idle`` of a cluster of the job's own size idle on
average (``--cluster`` times the job to change it), 20 % of the step fixed under the fixed
global batch. Three sets of join and leave costs:

* none: a join and a leave cost nothing;
* assumed: a join 3 min after the hole opens (start-up and heal), the live groups blocked 5 s
  per join (the quorum's change) and 10 s per leave (a heartbeat timeout of 5 s and the 5 s
  step in flight, discarded);
* graceful: the same joins, but a preempted group leaves at a step boundary within the
  preemption's grace time (no block).

    python benchmarks/tidal_sim.py [--seeds 10] [--idle 0.1] [--hole 1800] [--join 180] ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlaunch.policy.tidal_batches import FixedGlobal, PerGroup
from ddlaunch.policy.tidal_sim import Scenario, simulated

SCALES = (1_024, 16_384)


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--days", type=float, default=1.0, help="samples: days at the fixed width")
    p.add_argument("--idle", type=float, default=0.1, help="mean idle share of the cluster")
    p.add_argument("--cluster", type=float, default=1.0, help="the cluster in jobs' sizes")
    p.add_argument("--group-gpus", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="samples per core group per step")
    p.add_argument("--step", type=float, default=5.0, help="s, at the fixed width")
    p.add_argument("--fixed-share", type=float, default=0.2)
    p.add_argument("--hole", type=float, default=1800.0, help="mean hole life, s")
    p.add_argument("--join", type=float, default=180.0, help="start-up and heal, s")
    p.add_argument("--join-stall", type=float, default=5.0, help="s")
    p.add_argument("--leave", type=float, default=10.0, help="s")
    return p.parse_args()


def main() -> None:
    args = arguments()
    costs = {
        "none": (0.0, 0.0, 0.0),
        "assumed": (args.join, args.join_stall, args.leave),
        "graceful": (args.join, args.join_stall, 0.0),
    }
    print(
        f"{'GPUs':>7} {'policy':<13} {'costs':<9} {'fixed h':>8} {'tidal h':>8} {'speedup':>8} "
        f"{'extra':>6} {'joins':>6} {'leaves':>6} {'lost':>5} {'blocked':>8}"
    )
    started = time.perf_counter()
    for gpus in SCALES:
        groups = gpus // args.group_gpus
        for policy in (FixedGlobal(batch=args.batch * groups), PerGroup(batch=args.batch)):
            for name, (join, stall, leave) in costs.items():
                s = Scenario(
                    groups=groups,
                    group_gpus=args.group_gpus,
                    policy=policy,
                    cluster_gpus=int(gpus * args.cluster),
                    idle_fraction=args.idle,
                    hole_s=args.hole,
                    step_s=args.step,
                    fixed_share=args.fixed_share,
                    join_s=join,
                    join_stall_s=stall,
                    leave_s=leave,
                )
                samples = s.rate(groups) * args.days * 86_400.0
                results = simulated(s, samples, args.seeds)
                wall = sum(r.wall_s for r in results)
                fixed = sum(r.fixed_s for r in results)
                n = len(results)
                label = "fixed global" if isinstance(policy, FixedGlobal) else "per group"
                print(
                    f"{gpus:>7,} {label:<13} {name:<9} {fixed / n / 3600:>8.2f} "
                    f"{wall / n / 3600:>8.2f} {fixed / wall:>8.3f} "
                    f"{sum(r.extra_s for r in results) / wall:>6.2f} "
                    f"{sum(r.joins for r in results) / n:>6.0f} "
                    f"{sum(r.leaves for r in results) / n:>6.0f} "
                    f"{sum(r.lost_joins for r in results) / n:>5.0f} "
                    f"{sum(r.blocked_s for r in results) / wall:>7.2%}"
                )
    print(f"({args.seeds} seeds a row, {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
