"""submitit integration: the job folder, the pickles and the results are submitit's.

The seam: a job's call (the rank function on its run directory) is pickled with submitit's
``DelayedSubmission`` into submitit's job folder (``<run_dir>/submitit``, a sweep's
``<sweep>/submitit``) under submitit's name for it, ``<job id>_submitted.pkl``; every srun
task runs it with ``ddlaunch.worker.task``, which follows submitit's task protocol (the
equivalent of ``submitit.core._submit``: load the pickle, call it, write
``<job id>_<task>_result.pkl``, readable by submitit's own loader; task 0's only above 128
tasks) without importing
submitit, whose import cost every rank paid before its first step. ddlaunch keeps the batch
script (our Jinja2 render, which site templates govern) and the sbatch call (ddlaunch's
Slurm client).

One run (``ddlaunch.app.submit``) runs sbatch first and then writes its pickle for the job
id: the tasks wait for the file. A sweep's array task writes its own pickle when it starts
(``ddlaunch.job.sweep_task``): one file per task is not paid at submission. A requeued job
keeps its id and so its pickle; ``resume`` writes one for the new job id.

The rank function is pickled by name (``RankFunction``): writing the pickle imports none of
the ranks' code, so the login node and the batch host never load it.

Tested with submitit 1.5.x (setup.cfg pins ``>=1.5.2,<1.6``): ``DelayedSubmission`` and
the ``JobPaths`` file names are what this relies on.
"""

from __future__ import annotations

import pkgutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

RANK_FUNCTION = "ddlaunch.worker.rank:run_rank"


class RankFunction:
    """Stands for ``ddlaunch.worker.rank.run_rank`` in a pickle: it unpickles as that function
    (``pkgutil.resolve_name`` in the rank), so pickling it imports nothing of the ranks."""

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        return pkgutil.resolve_name, (RANK_FUNCTION,)

    def __call__(self, run_dir: str) -> Any:
        return pkgutil.resolve_name(RANK_FUNCTION)(run_dir)


def rank_call(run_dir: str | Path) -> Any:
    """submitit's ``DelayedSubmission`` of the rank function on ``run_dir``."""
    from submitit.core import utils as submitit_utils

    return submitit_utils.DelayedSubmission(RankFunction(), str(run_dir))


def write_pickle(folder: Path, job_id: str, fn: Callable[..., Any], *args: Any) -> Path:
    """Write the pickle the tasks of job ``job_id`` load (after sbatch: the id is known):
    submitit's ``DelayedSubmission`` of ``fn(*args)``, renamed into place."""
    from submitit.core import utils as submitit_utils

    delayed = submitit_utils.DelayedSubmission(fn, *args)
    tmp = folder / f"{uuid.uuid4().hex}.pkl"
    folder.mkdir(parents=True, exist_ok=True)
    delayed.dump(tmp)
    final = folder / f"{job_id}_submitted.pkl"
    tmp.replace(final)
    return final


def write_rank_pickle(folder: Path, run_dir: str | Path, job_id: str) -> Path:
    """The rank function on ``run_dir``, for the tasks of job ``job_id``."""
    return write_pickle(folder, job_id, RankFunction(), str(run_dir))
