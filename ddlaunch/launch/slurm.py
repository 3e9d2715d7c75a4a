"""submitit integration: a SlurmExecutor that submits ddlaunch's own rendered script.

The seam: submitit keeps the job folder (``<run_dir>/submitit``), pickles the rank function
and its arguments, and unpickles/runs them in every srun task (``submitit.core._submit``),
writing results and exceptions. ddlaunch replaces two things:

* the batch script text: our Jinja2 render (site templates govern it), not
  submitit's ``_make_sbatch_string``;
* the sbatch call: through ddlaunch's Slurm client and runner (the one subprocess seam),
  after the intent record is written.

A sweep's job array (``plan.array``) goes through the same executor: one pickle per array
task, ``<ARRAY>_<TASK>_submitted.pkl`` in the sweep's ``submitit/`` folder, each calling the
rank function on that member's run directory.

Tested with submitit 1.5.x (setup.cfg pins ``>=1.5.2,<1.6``): ``_submit_command`` and
``_internal_process_submissions`` are the private hooks used here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from submitit.core import utils as submitit_utils
from submitit.slurm.slurm import SlurmExecutor, SlurmJob

from ddlaunch.plan import LaunchPlan
from ddlaunch.slurm.client import SlurmClient


class DdlaunchSlurmExecutor(SlurmExecutor):
    def __init__(
        self,
        plan: LaunchPlan,
        script: str,
        client: SlurmClient,
        before_sbatch: Callable[[], None],
        python: str = "python3",
    ) -> None:
        super().__init__(folder=Path(plan.run_dir) / "submitit", python=python)
        self._plan = plan
        self._script = script
        self._client = client
        self._before_sbatch = before_sbatch
        self.job_id: str | None = None

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _num_tasks(self) -> int:
        return self._plan.world_size

    def _internal_process_submissions(
        self, delayed_submissions: list[submitit_utils.DelayedSubmission]
    ) -> list[SlurmJob]:  # type: ignore[override]
        if self._plan.array is None:
            return super()._internal_process_submissions(delayed_submissions)  # type: ignore
        # A sweep's array: submitit's own array path (pickles under temporary names, one
        # sbatch, then renamed to <ARRAY>_<TASK>_submitted.pkl, which the task waits for),
        # but with our script and our sbatch call instead of a plain SlurmExecutor's.
        assert len(delayed_submissions) == len(self._plan.array.members)
        folder = submitit_utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("time", 5)
        temporary = []
        for delayed in delayed_submissions:
            path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(timeout_min, self.max_num_timeout)
            delayed.dump(path)
            temporary.append(path)
        try:
            array_job = self._submit_command(self._submitit_command_str)
        except BaseException:
            for path in temporary:
                path.unlink(missing_ok=True)
            raise
        ranks = list(range(self._num_tasks()))
        jobs = [
            SlurmJob(folder=self.folder, job_id=f"{array_job.job_id}_{task}", tasks=ranks)
            for task in range(len(delayed_submissions))
        ]
        for path, job in zip(temporary, jobs, strict=True):
            # = job.paths.submitted_pickle, without building path objects per task
            os.replace(path, os.path.join(folder, f"{job.job_id}_submitted.pkl"))
        return jobs

    def _submit_command(self, command: str) -> SlurmJob:  # type: ignore[override]
        # The script was written to the run dir by the caller; sbatch reads it from there.
        self._before_sbatch()
        job_id = self._client.sbatch(self._plan.sbatch_argv)
        self.job_id = job_id
        return SlurmJob(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))


def submit_with_submitit(
    plan: LaunchPlan,
    script: str,
    client: SlurmClient,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    before_sbatch: Callable[[], None],
    python: str,
) -> str:
    """Pickle ``fn(*args)`` into the run's submitit folder and submit ``script``."""
    executor = DdlaunchSlurmExecutor(plan, script, client, before_sbatch, python=python)
    executor._throttling = 0.0  # one submission; submitit's pacing only matters in loops
    executor.submit(fn, *args)
    assert executor.job_id is not None
    return executor.job_id


def submit_array_with_submitit(
    plan: LaunchPlan,
    script: str,
    client: SlurmClient,
    fn: Callable[..., Any],
    args_per_task: list[tuple[Any, ...]],
    before_sbatch: Callable[[], None],
    python: str,
) -> str:
    """Pickle ``fn(*args)`` for every task of ``plan.array`` into the sweep's submitit folder
    and submit ``script`` once as a job array; returns the array job id."""
    assert plan.array is not None and len(args_per_task) == len(plan.array.members)
    executor = DdlaunchSlurmExecutor(plan, script, client, before_sbatch, python=python)
    executor._throttling = 0.0
    executor.map_array(fn, *zip(*args_per_task, strict=True))
    assert executor.job_id is not None
    return executor.job_id


def write_pickle_only(
    folder: Path, fn: Callable[..., Any], args: tuple[Any, ...], job_id: str
) -> Path:
    """Write the pickle a requeued or resubmitted job id will load (used by resume)."""
    delayed = submitit_utils.DelayedSubmission(fn, *args)
    tmp = folder / f"{uuid.uuid4().hex}.pkl"
    folder.mkdir(parents=True, exist_ok=True)
    delayed.dump(tmp)
    final = folder / f"{job_id}_submitted.pkl"
    tmp.replace(final)
    return final
