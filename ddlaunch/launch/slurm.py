"""submitit integration: the job folder, the pickles and the results are submitit's.

The seam: a job's call (the rank function on its run directory) is pickled with submitit's
``DelayedSubmission`` into submitit's job folder (``<run_dir>/submitit``, a sweep's
``<sweep>/submitit``) under submitit's name for it, ``<job id>_submitted.pkl``; every srun
task runs it with ``ddlaunch.worker.task``, which follows submitit's task protocol (the
equivalent of ``submitit.core._submit``: load the pickle, call it, write
``<job id>_<task>_result.pkl``, readable by submitit's own loader) without importing
submitit, whose import cost every rank paid before its first step. ddlaunch keeps the batch
script (our Jinja2 render, which site templates govern) and the sbatch call (ddlaunch's
Slurm client).

One run (``ddlaunch.submit``) runs sbatch first and then writes its pickle for the job id:
the tasks wait for the file. A sweep's array task writes its own pickle when it starts
(``ddlaunch.sweep_members``): one file per task is not paid at submission. A requeued job
keeps its id and so its pickle; ``resume`` writes one for the new job id.

Tested with submitit 1.5.x (setup.cfg pins ``>=1.5.2,<1.6``): ``DelayedSubmission`` and
the ``JobPaths`` file names are what this relies on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from submitit.core import utils as submitit_utils


def write_pickle_only(
    folder: Path, fn: Callable[..., Any], args: tuple[Any, ...], job_id: str
) -> Path:
    """Write the pickle the tasks of job ``job_id`` load (after sbatch: the id is known)."""
    delayed = submitit_utils.DelayedSubmission(fn, *args)
    tmp = folder / f"{uuid.uuid4().hex}.pkl"
    folder.mkdir(parents=True, exist_ok=True)
    delayed.dump(tmp)
    final = folder / f"{job_id}_submitted.pkl"
    tmp.replace(final)
    return final
