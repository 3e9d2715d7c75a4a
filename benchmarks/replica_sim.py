"""Simulated goodput of replica groups beside a whole-job restart, at 16,384 and 131,072 GPUs.

No cluster: ``policy.replica_sim`` (its simulation and its closed form, side by side) at the
job MTTF of 1.8 h that Kokolis et al. 2024 ("Revisiting Reliability in Large-Scale Machine
Learning Research Clusters") report at 16,384 GPUs, and at 131,072 GPUs with the same per-GPU
rate (1.8 h x 16384 / 131072 = 13.5 min). 8 GPUs per node, a checkpoint save blocking
``--save`` seconds every Young-Daly interval of the job MTTF, the same in every row (the
baseline keeps its interval; the groups keep the baseline's checkpoints for a whole-job
failure). Each row: whole-job restart (today's path, the baseline) or ``--groups`` replica
groups (min_replica_groups 1, no spare pool), under two sets of costs:

* measured on the development machine (the defaults): whole-job restart 12 s kill -> next step,
  a group's restart 4.5 s kill -> back in the quorum, the survivors' stall 1.0 s, one step of
  0.19 s redone by the survivors (the example MLP's step, benchmarks/bench_spares.py);
* large-scale: whole-job restart 10 min, a group's 3 min, a stall of 5 s (Meta's published
  fault-tolerant HSDP figures), one step of 5 s redone (an assumption, not a published figure).

Goodput = useful samples / (wall x the uninterrupted rate), over ``--seeds`` runs of ``--mttfs``
job MTTFs each (the same failure times in every row of a scale), with the shares of the wall
time it lost and the closed form's goodput. Target: replica groups above the whole-job
restart at both scales and both sets of costs.

    python benchmarks/replica_sim.py [--seeds 100] [--groups 8,16,64] [--job-restart 12] ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlaunch.policy import interval
from ddlaunch.policy.replica_sim import Scenario, expected, gpu_mttf, simulated

KOKOLIS_GPUS = 16_384
KOKOLIS_MTTF_S = 1.8 * 3600  # the job's MTTF at 16,384 GPUs
SCALES = (16_384, 131_072)
GPUS_PER_NODE = 8


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--mttfs", type=float, default=100.0, help="job MTTFs of training per run")
    p.add_argument("--groups", default="8,16,64", help="replica-group counts, comma-separated")
    p.add_argument("--save", type=float, default=2.0, help="checkpoint save (s, blocking)")
    p.add_argument("--job-restart", type=float, default=12.0, help="measured, s")
    p.add_argument("--group-restart", type=float, default=4.5, help="measured, s")
    p.add_argument("--stall", type=float, default=1.0, help="measured, s")
    p.add_argument("--step", type=float, default=0.19, help="measured step, s")
    p.add_argument("--lost-steps", type=float, default=1.0, help="redone per group failure")
    p.add_argument("--large-job-restart", type=float, default=600.0, help="s")
    p.add_argument("--large-group-restart", type=float, default=180.0, help="s")
    p.add_argument("--large-stall", type=float, default=5.0, help="s")
    p.add_argument("--large-step", type=float, default=5.0, help="assumed step, s")
    return p.parse_args()


def rows(args: argparse.Namespace, gpus: int, costs: str) -> tuple[list[str], list[float]]:
    """The table's rows of one scale and set of costs, and their simulated goodputs."""
    large = costs == "large-scale"
    job_mttf = KOKOLIS_MTTF_S * KOKOLIS_GPUS / gpus
    shared = dict(
        gpus=gpus,
        gpus_per_node=GPUS_PER_NODE,
        gpu_mttf_s=gpu_mttf(job_mttf, gpus),
        interval_s=interval.young_daly(args.save, job_mttf),
        save_s=args.save,
        job_restart_s=args.large_job_restart if large else args.job_restart,
        group_restart_s=args.large_group_restart if large else args.group_restart,
        stall_s=args.large_stall if large else args.stall,
        step_s=args.large_step if large else args.step,
        lost_steps=args.lost_steps,
    )
    out, goodputs = [], []
    baseline = None
    for groups in (1, *(int(g) for g in args.groups.split(","))):
        s = Scenario(groups=groups, **shared)  # type: ignore[arg-type]
        run, closed = simulated(s, seeds=args.seeds, mttfs=args.mttfs), expected(s)
        baseline = run.goodput if baseline is None else baseline
        goodputs.append(run.goodput)
        name = "whole-job restart" if groups == 1 else f"{groups} replica groups"
        shares = (
            run.saves_s,
            run.stalls_s + run.redone_s,
            run.degraded_s,
            run.restarts_s,
            run.lost_s,
        )
        out.append(
            f"  {gpus:>7,} {costs:11} {name:18} {run.goodput:8.3%} {closed.goodput:8.3%} "
            f"{100 * (run.goodput - baseline):+6.2f} pp "
            + " ".join(f"{run.share(x):7.3%}" for x in shares)
            + f" {run.failures:6} {run.job_failures:6}"
        )
    return out, goodputs


def main() -> None:
    args = arguments()
    started = time.perf_counter()
    print(
        f"simulated goodput, {args.seeds} seeds x {args.mttfs:g} job MTTFs; MTTF 1.8 h at "
        f"16,384 GPUs (Kokolis et al. 2024), the same per-GPU rate at 131,072; save "
        f"{args.save:g} s every Young-Daly interval; min_replica_groups 1"
    )
    print(
        f"  measured costs:    whole-job restart {args.job_restart:g} s, group restart "
        f"{args.group_restart:g} s, stall {args.stall:g} s, {args.lost_steps:g} step of "
        f"{args.step:g} s redone\n"
        f"  large-scale costs: whole-job restart {args.large_job_restart:g} s, group restart "
        f"{args.large_group_restart:g} s, stall {args.large_stall:g} s, {args.lost_steps:g} "
        f"step of {args.large_step:g} s redone"
    )
    print(
        f"  {'GPUs':>7} {'costs':11} {'recovery':18} {'goodput':>8} {'closed':>8} "
        f"{'vs whole':>9} {'saves':>7} {'stalls':>7} {'down':>7} {'restart':>7} "
        f"{'lost':>7} {'group':>6} {'job':>6}"
    )
    print(
        f"  {'':7} {'':11} {'':18} {'':8} {'form':>8} {'':9} {'':7} {'+redo':>7} "
        f"{'groups':>7} {'job':>7} {'work':>7} {'fails':>6} {'fails':>6}"
    )
    met = True
    for gpus in SCALES:
        for costs in ("measured", "large-scale"):
            lines, goodputs = rows(args, gpus, costs)
            print("\n".join(lines), flush=True)
            met = met and all(g > goodputs[0] for g in goodputs[1:])
    print(
        f"  replica groups above the whole-job restart everywhere: {'met' if met else 'MISSED'} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
