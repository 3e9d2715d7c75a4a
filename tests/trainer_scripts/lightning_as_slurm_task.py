"""The Lightning example as a task of a Slurm job, on this machine: the rank's ``SLURM_*``
variables are set from ddlaunch's (``RANK``, ``WORLD_SIZE``; one rank per "node", as
``--nodes N --devices 1`` asks) before the script runs, so that Lightning detects Slurm by
itself and installs its auto-requeue handler (SIGUSR1: save ``hpc_ckpt_N.ckpt``, then
``scontrol requeue`` from rank 0) exactly as in a job. ``SLURM_JOB_ID`` is the test's
``LOCAL_SLURM_JOB_ID``; ``scontrol`` is whatever the test puts first on ``PATH``. Then
``example_with_pid.py ARGS...`` runs (the rank's pid for the test, then the example)."""

import os
import runpy
from pathlib import Path

rank = os.environ["RANK"]
os.environ.update(
    SLURM_NTASKS=os.environ["WORLD_SIZE"],
    SLURM_NTASKS_PER_NODE="1",
    SLURM_PROCID=rank,
    SLURM_NODEID=rank,
    SLURM_LOCALID="0",
    SLURM_JOB_NAME="lightning-local",
    SLURM_JOB_ID=os.environ["LOCAL_SLURM_JOB_ID"],
)
runpy.run_path(str(Path(__file__).with_name("example_with_pid.py")), run_name="__main__")
