"""The one exit path of a task (``ddlaunch.worker.leave``, called by ``worker.task.main``):
a finished rank leaves with status 0 after its result, its threads and its exit handlers, and
never through the native teardown that can abort it; a failed one with its own status."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import exit_entrypoints

from ddlaunch.launch.local import free_local_port
from ddlaunch.launch.slurm import write_pickle

TESTS = Path(__file__).resolve().parent


def task_env(job: str, rank: int, world: int = 1) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "SLURM_JOB_ID": job,
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(world),
        "SLURM_LOCALID": str(rank),
    }


def start_task(folder: Path, job: str, rank: int = 0, world: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-u", "-m", "ddlaunch.worker.task", str(folder)],
        env=task_env(job, rank, world),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_task(folder: Path, job: str) -> subprocess.CompletedProcess[str]:
    proc = start_task(folder, job)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def result(folder: Path, job: str, rank: int = 0) -> tuple[str, object]:
    with open(folder / f"{job}_{rank}_result.pkl", "rb") as handle:
        return pickle.load(handle)  # type: ignore[no-any-return]


def test_a_rank_that_returns_leaves_with_0_after_its_threads_and_exit_handlers(
    tmp_path: Path,
) -> None:
    write_pickle(tmp_path, "11", exit_entrypoints.leaves_work_behind, str(tmp_path))
    proc = run_task(tmp_path, "11")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert result(tmp_path, "11") == ("success", "returned")
    # The non-daemon thread finished its write and the exit handler ran; the idle pool's
    # workers were told to stop (a plain join of them would wait forever).
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "atexit").read_text() == "done"


def test_a_rank_that_raises_leaves_with_1_its_traceback_and_an_error_result(
    tmp_path: Path,
) -> None:
    write_pickle(tmp_path, "12", exit_entrypoints.raises, "boom at step 7")
    proc = run_task(tmp_path, "12")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert proc.stderr.splitlines()[-1] == "RuntimeError: boom at step 7"
    kind, text = result(tmp_path, "12")
    assert kind == "error" and "RuntimeError: boom at step 7" in str(text)


def test_sys_exit_in_a_rank_gives_its_code(tmp_path: Path) -> None:
    for job, code in (("13", 3), ("14", 0)):
        write_pickle(tmp_path, job, exit_entrypoints.exits, code)
        assert run_task(tmp_path, job).returncode == code


def test_ranks_that_keep_their_gloo_group_all_leave_with_0(tmp_path: Path) -> None:
    """The abort this exit path avoids: ranks that return with their process group alive.
    Twenty 2-rank rounds, every rank must end with status 0 and a success result (with
    Python's own exit, 2 of 20 such rounds aborted here: `terminate called without an active
    exception`)."""
    port = free_local_port()
    codes = []
    for round_ in range(20):
        job = f"2{round_}"
        init = f"tcp://127.0.0.1:{port}"
        folder = tmp_path / job
        for rank in (0, 1):
            write_pickle(folder, f"{job}r{rank}", exit_entrypoints.keeps_its_group, init, rank, 2)
        procs = [start_task(folder, f"{job}r{rank}", rank, 2) for rank in (0, 1)]
        for rank, proc in enumerate(procs):
            _, err = proc.communicate(timeout=120)
            codes.append(proc.returncode)
            assert proc.returncode == 0, f"round {round_} rank {rank}: {err}"
            assert result(folder, f"{job}r{rank}", rank) == ("success", 2)
    assert codes == [0] * 40
