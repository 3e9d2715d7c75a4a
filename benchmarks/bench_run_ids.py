"""How often two of N ``submit`` calls in one second draw the same run id, in one run: the
previous id (job name + second + 2 random bytes) beside the current one (4 random bytes).

    python benchmarks/bench_run_ids.py [--submits 50] [--trials 20000]

Each trial draws ``--submits`` ids of one job name within one second, as 50 concurrent
``ddlaunch submit`` of one config do (all in the same second on this machine: the run ids
of ``tests/test_concurrency_slurm.py`` share their time part), with the id function itself
(``store.rundir.new_run_id``) and with the previous scheme. A collision there was an
internal error (FileExistsError) and a lost submission; now it cannot be one (the directory
is renamed into place, a taken id gets a fresh one), and it is also rarer by 2**16. The
birthday bound is printed beside the measured rates.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from ddlaunch.store.rundir import new_run_id


def old_run_id(job_name: str, now: float) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job_name}-{stamp}-{os.urandom(2).hex()}"


def rate(make: object, submits: int, trials: int) -> float:
    now = time.time()
    hits = 0
    for _ in range(trials):
        ids = {make("mlp-example", now) for _ in range(submits)}  # type: ignore[operator]
        hits += len(ids) < submits
    return hits / trials


def birthday(submits: int, bits: int) -> float:
    space = 2.0**bits
    return 1.0 - math.prod(1.0 - i / space for i in range(submits))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submits", type=int, default=50)
    parser.add_argument("--trials", type=int, default=20000)
    args = parser.parse_args()
    n, trials = args.submits, args.trials
    old = rate(old_run_id, n, trials)
    new = rate(new_run_id, n, trials)
    print(f"{n} submits in one second, {trials} trials each")
    bound_old, bound_new = birthday(n, 16), birthday(n, 32)
    print(f"  previous ids (16 random bits): {old:.2%} of trials collide (bound {bound_old:.2%})")
    print(f"  current ids (32 random bits):  {new:.4%} of trials collide (bound {bound_new:.1e})")
    if new:
        print(f"  ratio previous/current: {old / new:.0f}x")
    else:
        print(f"  none in {trials} trials (95 % upper bound, rule of three: {3 / trials:.1e})")


if __name__ == "__main__":
    main()
