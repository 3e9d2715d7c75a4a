"""What every srun task runs: ``python -u -m ddlaunch.worker.task <submitit folder>``.

The same protocol as submitit's own task runner (``submitit.core._submit``): load
``<job>_submitted.pkl`` from the job folder, call the pickled function, write
``("success", result)`` or ``("error", traceback)`` to ``<job>_<task>_result.pkl`` (renamed
into place), where ``<job>`` is ``ARRAY_TASK`` for an array task. The pickles are submitit's.
Above 128 tasks only task 0 writes its result (``writes_result``).

Why not submitit's runner: it imports all of submitit (~0.15 s of CPU per rank, on a node
whose ranks all start at once and are busy importing torch) and polls for the pickle once a
second. The pickle holds a ``submitit.core.utils.DelayedSubmission``; it is unpickled into a
stand-in with the same fields, so submitit is imported only if the pickle refers to anything
else of it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddlaunch.config.components import TRAIN_COMPONENTS_VAR
from ddlaunch.planning.group_env import GroupIdentity, job_rank
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import LOGS_DIR
from ddlaunch.worker import leave, signals
from ddlaunch.worker.distenv import from_environ

WAIT_FOR_PICKLE_S = 60.0  # submitit's runner waits as long
RESULTS_EVERY_TASK_UP_TO = 128  # above, only task 0 writes a result file (writes_result)


class Delayed:
    """Stand-in for ``submitit.core.utils.DelayedSubmission``: the call to make."""

    function: Any
    args: tuple[Any, ...]
    kwargs: dict[str, object]

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def call(self) -> Any:
        return self.function(*self.args, **self.kwargs)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("submitit.core.utils", "DelayedSubmission"):
            return Delayed
        return super().find_class(module, name)


def job_id(env: Mapping[str, str]) -> str:
    """submitit's job id: ``ARRAY_TASK`` for an array task, else the job id (a local run's
    own id, ``SUBMITIT_LOCAL_JOB_ID``, outside Slurm)."""
    task = AttemptId.from_env(env).task or env.get("SUBMITIT_LOCAL_JOB_ID", "")
    if not task:
        raise RuntimeError(
            "no SLURM_JOB_ID (nor DDLAUNCH_K8S_JOB, SUBMITIT_LOCAL_JOB_ID): "
            "not a Slurm task, a pod or a local rank"
        )
    return task


def load(path: Path, wait_s: float = WAIT_FOR_PICKLE_S) -> Delayed:
    """The pickled call; waits for the file (submit writes it right after sbatch returns)."""
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {wait_s:.0f} s for the job pickle {path}")
        time.sleep(0.05)
    with open(path, "rb") as handle:
        delayed = _Unpickler(handle).load()
    if not isinstance(delayed, Delayed):
        raise RuntimeError(f"{path} does not hold a submitit DelayedSubmission")
    return delayed


def write_result(path: Path, outcome: tuple[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(outcome, handle)
    os.replace(tmp, path)


def writes_result(task: int, tasks: int) -> bool:
    """Whether this task writes its result file. Every task of a job of up to
    ``RESULTS_EVERY_TASK_UP_TO`` tasks, as submitit's loader expects; above, task 0 only:
    16,000 result files would be 16,000 creates and renames in one directory within a second
    of the job's end, from 2,000 nodes, on a parallel filesystem's one metadata server.
    ddlaunch's own books (``result.json``, the failure records) do not read them."""
    return task == 0 or tasks <= RESULTS_EVERY_TASK_UP_TO  # 0 tasks: not known, so written


def task_of(env: Mapping[str, str]) -> tuple[int, int]:
    """(this task's job-wide rank, the job's task count; 0 where the environment does not
    say): srun's task id (job-wide in a replica group), or a pod's or local rank."""
    if "SLURM_PROCID" not in env:
        dist = from_environ(env)
        return dist.rank, dist.world_size
    step_tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 0)
    grouped = job_rank(env)
    if grouped is None:
        return int(env["SLURM_PROCID"]), step_tasks
    identity = GroupIdentity.from_env(env)
    return grouped, step_tasks * (identity.groups if identity is not None else 1)


def run(folder: Path, env: Mapping[str, str] = os.environ) -> Any:
    task, tasks = task_of(env)
    job = job_id(env)
    delayed = load(folder / f"{job}_submitted.pkl")
    result_path = folder / f"{job}_{task}_result.pkl" if writes_result(task, tasks) else None
    try:
        result = delayed.call()
    except Exception:
        # As submitit records it; the exception still ends the task with a nonzero status.
        if result_path is not None:
            with contextlib.suppress(OSError):
                write_result(result_path, ("error", traceback.format_exc()))
        raise
    if result_path is None:
        return result
    try:
        write_result(result_path, ("success", result))
    except (OSError, pickle.PicklingError) as exc:
        print(f"[ddlaunch] could not write the task result: {exc}", file=sys.stderr, flush=True)
    return result


def redirect_group_logs(env: Mapping[str, str]) -> None:
    """A replica group's rank writes ``logs/rank-<job-wide rank>.out|.err`` itself: srun's
    ``%t`` numbers each group's step from 0, so srun's own files would collide (the
    supervisor points srun at one file per group, for what is printed before this). So does
    a rank of a heterogeneous job: there srun's ``%t`` is not the rank past the first
    component (the plan points srun at one file per node)."""
    rank, run_dir = job_rank(env), env.get("DDLAUNCH_RUN_DIR")
    if rank is None and env.get(TRAIN_COMPONENTS_VAR) and env.get("SLURM_PROCID"):
        rank = int(env["SLURM_PROCID"])
    if rank is None or not run_dir:
        return
    append_output_to_rank_logs(Path(run_dir), rank)


def append_output_to_rank_logs(run_dir: Path, rank: int) -> None:
    """From here on this process's stdout and stderr append to ``logs/rank-<rank>.out|.err``
    (a replica group's rank; a standby that took a dead rank's place)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, stream in ((1, "out"), (2, "err")):
        with contextlib.suppress(OSError):
            path = run_dir / LOGS_DIR / f"rank-{rank}.{stream}"
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ddlaunch.worker.task SUBMITIT_FOLDER", file=sys.stderr)
        return 2

    # Before anything else, as submitit's runner does: the pre-timeout signal (and SIGTERM)
    # only set the stop flag; their default action would end the task.
    signals.install(os.environ.get("SUBMITIT_PREEMPT_SIGNAL") or "USR2", also=("TERM",))
    redirect_group_logs(os.environ)
    # Every way out goes through ddlaunch.worker.leave: a finished rank never aborts in the
    # interpreter's native teardown.
    try:
        run(Path(args[0]))
        # Whatever ran (an entry point keeps the preflight's group; HF Trainer and Lightning
        # never destroy theirs): no rank leaves while a peer may still talk to it.
        leave.leave_process_group()
    except SystemExit as exc:  # our own stops (StopRank) and a script's sys.exit(N)
        leave.fast_exit(leave.exit_code(exc))
    except BaseException:
        sys.excepthook(*sys.exc_info())
        leave.fast_exit(1)
    leave.fast_exit(0)


if __name__ == "__main__":
    sys.exit(main())
