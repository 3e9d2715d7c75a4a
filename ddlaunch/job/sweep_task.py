"""``python -m ddlaunch.job.sweep_task start MEMBER_RUN_DIR``: the first thing a sweep's array
task does on the batch host (torch-free): make sure its member's run directory exists (with
this task's job id) and that submitit finds the task's pickle,
``<sweep>/submitit/<ARRAY>_<TASK>_submitted.pkl`` (written here, not at submission: one file
per task is what submitting must not pay)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ddlaunch.launch.slurm import write_rank_pickle
from ddlaunch.store.members import materialize, member_of
from ddlaunch.store.rundir import SUBMITIT_DIR


def start_task(run_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    found = member_of(run_dir)
    if found is None:
        raise SystemExit(f"{run_dir} is not a member directory of a sweep (members.json)")
    sweep_dir, index = found
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if not array or not task:  # not an array task (e.g. `ddlaunch resume` of a member)
        return materialize(sweep_dir, index)
    job_id = f"{array}_{task}"
    run = materialize(sweep_dir, index, job_id, env.get("DDLAUNCH_SWEEP_ARRAY"))
    folder = sweep_dir / SUBMITIT_DIR
    if not (folder / f"{job_id}_submitted.pkl").exists():
        write_rank_pickle(folder, run, job_id)
    return run


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "start":
        print("usage: python -m ddlaunch.job.sweep_task start MEMBER_RUN_DIR", file=sys.stderr)
        return 2
    run = start_task(Path(args[1]))
    print(f"[ddlaunch] member directory {run}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
