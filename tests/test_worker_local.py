"""The rank runtime through the local runner: real processes, real gloo, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from support.rundirs import loaded_run_dir

import ddlaunch.examples
from ddlaunch.config import Config, load_config, to_plain
from ddlaunch.launch import local
from ddlaunch.launch.local import LocalRunError, run_local
from ddlaunch.planning.ports import PORT_HIGH, PORT_LOW
from ddlaunch.store.failures import read_failure
from ddlaunch.worker import signals

TORCHRUN_SCRIPT = Path(ddlaunch.examples.__file__).parent / "torchrun_script.py"


def test_signal_handler_only_sets_a_flag() -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        signals.reset()
        assert set(signals.install("USR2")) == {"SIGTERM", "SIGUSR2"}
        assert not signals.requested()
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)  # the handler runs between two bytecodes of the main thread
        assert signals.requested() and signals.reason() == "SIGUSR2"
        os.kill(os.getpid(), signal.SIGTERM)  # the process survives; the first reason stays
        time.sleep(0.01)
        assert signals.reason() == "SIGUSR2"
        assert signals.agreed()  # no process group: the local flag
        signals.reset()
        assert not signals.requested()
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        signals.reset()


def test_another_trainer_gets_the_default_signal_actions_back() -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        signals.install("USR2")  # what the task does first thing
        signals.restore_defaults("USR2", "TERM")  # what the rank does for trainer.kind hf...
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # a TERM stops it again
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def test_a_trainer_without_a_handler_dies_on_the_stop(tmp_path: Path) -> None:
    """The TERM ddlaunch's stop hook sends ends a trainer.kind other than ddlaunch/none
    (found on the dev cluster: the flag handler used to swallow it until the time limit)."""
    import threading

    pid_file = tmp_path / "pid"
    run = loaded_run_dir(
        tmp_path / "run",
        "examples/mlp",
        entrypoint=None,
        script=str(Path(__file__).parent / "trainer_scripts" / "sleeper.py"),
        args=(str(pid_file),),
    )
    text = (run / "config.yaml").read_text().replace("  kind: null\n", "  kind: torchtune\n", 1)
    (run / "config.yaml").write_text(text)
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            run_local(run, world_size=1, timeout_s=60)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    sent = time.monotonic()
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    thread.join(30)
    assert time.monotonic() - sent < 10
    assert errors and isinstance(errors[0], LocalRunError)
    assert "SIGTERM" in str(errors[0])


def test_signal_names() -> None:
    assert signals.signal_number("usr1") == signal.SIGUSR1
    assert signals.signal_number("SIGHUP") == signal.SIGHUP
    with pytest.raises(ValueError, match="unknown signal"):
        signals.signal_number("NOPE")


def test_unmodified_torchrun_script(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = loaded_run_dir(
        tmp_path / "run",
        "examples/mlp",
        entrypoint=None,
        script=str(TORCHRUN_SCRIPT),
        args=("--value", "2.5", "--out", str(out)),
    )
    results = run_local(run, world_size=2, timeout_s=120)
    assert [r["rank"] for r in results] == [0, 1]
    records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    for rank, record in enumerate(records):
        assert record["rank"] == record["local_rank"] == rank
        assert record["world_size"] == 2
        assert record["rank_sum"] == 0 + 1  # every rank agrees on the all-reduce
        assert record["value_sum"] == 2.5 * (1 + 2)
        header = (run / "logs" / f"rank-{rank}.out").read_text()
        assert f"[ddlaunch] rank {rank}/2 local {rank} host " in header


def test_launch_module_runs_python_dash_m_with_resume_args(tmp_path: Path) -> None:
    """launch.module as torchrun -m runs it; a custom trainer layout's resume arguments are
    added for the latest complete checkpoint, replacing the flag given in launch.args."""
    out = tmp_path / "out"
    cfg: Config = load_config(
        "examples/mlp",
        [
            "launch.entrypoint=null",
            "launch.module=ddlaunch.examples.torchrun_script",
            f"launch.args=[--value, '1.0', --out, {out}, --value, '9']",
            "trainer.kind=custom",
            "trainer.pattern=ckpt-*",
            "trainer.step_regex=^ckpt-([0-9]+)$",
            "trainer.requires=[done]",
            "trainer.resume_args=[--value, '{step}']",
            f"trainer.checkpoint_dir={tmp_path}/ckpts",
        ],
    )
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    for step, complete in ((2, True), (3, True), (4, False)):
        (tmp_path / "ckpts" / f"ckpt-{step}").mkdir(parents=True)
        if complete:
            (tmp_path / "ckpts" / f"ckpt-{step}" / "done").write_text("")
    run_local(run, world_size=2, timeout_s=120)
    records = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    # --value 3 (the step of ckpt-3) replaced both --value given: 3 * (1 + 2)
    assert [r["value_sum"] for r in records] == [9.0, 9.0]
    log = (run / "logs" / "rank-0.out").read_text()
    assert f"rank runs: python3 -m ddlaunch.examples.torchrun_script --out {out} --value 3" in log


FAILING_ENTRY = """
    import os
    import signal
    import time
    from pathlib import Path

    import torch.distributed as dist

    from ddlaunch.worker import signals
    from ddlaunch.worker.distributed import init_distributed


    def main(config):
        run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
        marker = run_dir / "rank0-survived-signals"
        if int(os.environ["RANK"]) == 1:
            # Fail only once rank 0 has recorded its signal check (no race with the kill).
            deadline = time.monotonic() + 60
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise ValueError("boom on rank one")
        # Under submitit, SIGUSR2 would run submitit's rank-0 checkpoint-and-requeue handler
        # (which raises here: nothing to checkpoint). run_rank's handler must have replaced it.
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        marker.write_text(str(signals.reason()))
        init_distributed()  # rank 1 never joins: blocks until the runner stops this rank
        dist.barrier()
"""


def test_failing_rank_is_named_and_its_peers_are_stopped(tmp_path: Path) -> None:
    (tmp_path / "failing_entry.py").write_text(textwrap.dedent(FAILING_ENTRY))
    run = loaded_run_dir(
        tmp_path / "run", "examples/mlp", entrypoint="failing_entry:main", workdir=str(tmp_path)
    )
    started = time.monotonic()
    with pytest.raises(LocalRunError) as info:
        run_local(run, world_size=2, timeout_s=120)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert info.value.rank == 1
    assert "rank 1 failed: ValueError: boom on rank one" in message
    assert "failing_entry.py:" in message  # the failing line
    record = read_failure(run, 1)
    assert record is not None
    assert (record.rank, record.exception, record.message) == (
        1,
        "ValueError",
        "boom on rank one",
    )
    assert record.where is not None
    assert record.where.endswith(f"failing_entry.py:{record.where.rsplit(':', 1)[1]}")
    assert "raise ValueError" in record.traceback and record.attempt == 0
    # Rank 0 was blocked in the rendezvous; the runner ended it (kill-on-bad-exit), long
    # before the timeout, and it left no failure of its own.
    assert elapsed < 90
    assert read_failure(run, 0) is None
    # The pre-timeout signal and SIGTERM only set the flag on rank 0.
    assert (run / "rank0-survived-signals").read_text() == "SIGUSR2"


def test_timeout_stops_the_ranks(tmp_path: Path) -> None:
    # A rank that runs past the timeout, at whatever point it is then (starting up or in
    # the entry point): the same stop path.
    sleeper = "import time\n\n\ndef main(config):\n    time.sleep(600)\n"
    (tmp_path / "sleeper_entry.py").write_text(sleeper)
    run = loaded_run_dir(
        tmp_path / "run", "examples/mlp", entrypoint="sleeper_entry:main", workdir=str(tmp_path)
    )
    started = time.monotonic()
    with pytest.raises(LocalRunError, match=r"timed out after 1\.5 s; ranks still running: \[0\]"):
        run_local(run, world_size=1, timeout_s=1.5)
    assert time.monotonic() - started < 1.5 + 10


def test_task_runner_runs_a_submitit_pickle_without_importing_submitit(tmp_path: Path) -> None:
    """``ddlaunch.worker.task`` reads submitit's pickle and writes submitit's result file, and
    its task process never imports submitit."""
    import pickle
    import subprocess
    import sys

    from ddlaunch.launch.slurm import write_pickle

    write_pickle(tmp_path, "4242_3", json.dumps, [1, 2])
    probe = (
        "import sys; from pathlib import Path; from ddlaunch.worker import task; "
        "print(task.run(Path(sys.argv[1]))); "
        "assert not [m for m in sys.modules if m.startswith('submitit')], 'submitit imported'"
    )
    env = {
        **os.environ,
        "SLURM_JOB_ID": "999",
        "SLURM_ARRAY_JOB_ID": "4242",
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_PROCID": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1, 2]"
    with open(tmp_path / "4242_3_1_result.pkl", "rb") as handle:
        assert pickle.load(handle) == ("success", "[1, 2]")
    # The seam with submitit: its own job paths name that file, and its loader reads it.
    from submitit.core.utils import JobPaths, pickle_load

    paths = JobPaths(tmp_path, job_id="4242_3", task_id=1)
    assert paths.submitted_pickle == tmp_path / "4242_3_submitted.pkl"
    assert pickle_load(paths.result_pickle) == ("success", "[1, 2]")


def test_above_128_tasks_only_task_0_writes_its_result(tmp_path: Path) -> None:
    """submitit's result file per task up to 128 tasks; above, task 0's only (one create at
    the job's end, not one per rank), a success or an error alike."""
    from ddlaunch.launch.slurm import write_pickle
    from ddlaunch.worker import task

    write_pickle(tmp_path, "555", json.dumps, [3])
    slurm = {"SLURM_JOB_ID": "555", "SLURM_NTASKS": "16000"}
    for rank in (0, 1, 15999):
        assert task.run(tmp_path, {**slurm, "SLURM_PROCID": str(rank)}) == "[3]"
    assert sorted(p.name for p in tmp_path.glob("*_result.pkl")) == ["555_0_result.pkl"]
    small = {"SLURM_JOB_ID": "556", "SLURM_STEP_NUM_TASKS": "128", "SLURM_NTASKS": "16000"}
    write_pickle(tmp_path, "556", json.dumps, [4])
    task.run(tmp_path, {**small, "SLURM_PROCID": "127"})  # the step's count decides
    assert (tmp_path / "556_127_result.pkl").exists()
    # A replica group's rank counts the job's tasks: 2 groups of 100 are 200.
    grouped = {
        "SLURM_JOB_ID": "557", "SLURM_NTASKS": "100", "SLURM_PROCID": "3",
        "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "2", "DDLAUNCH_GROUP_RANK_OFFSET": "100",
    }  # fmt: skip
    assert task.task_of(grouped) == (103, 200)
    assert not task.writes_result(103, 200) and task.writes_result(0, 200)
    assert task.writes_result(5, 0)  # a count not known: written, as submitit expects


def test_the_rank_pickle_names_the_rank_function_without_importing_it(tmp_path: Path) -> None:
    """Writing a job's pickle (``submit``, a sweep task's start on the batch host) imports none
    of the ranks' code; loading it (in the rank) gives ``run_rank`` on the run directory."""
    import subprocess
    import sys

    probe = (
        "import sys; from pathlib import Path; from ddlaunch.launch import slurm; "
        "slurm.write_rank_pickle(Path(sys.argv[1]), '/runs/r', '77'); "
        "assert not [m for m in sys.modules if m.startswith('ddlaunch.worker')], 'worker imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    from ddlaunch.worker import task
    from ddlaunch.worker.rank import run_rank

    delayed = task.load(tmp_path / "77_submitted.pkl")
    assert delayed.function is run_rank and delayed.args == ("/runs/r",)


def test_local_ranks_meet_on_a_free_port_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Port 0's choice is an ephemeral port, which an outgoing connection may take before the
    # ranks bind it (EADDRINUSE); below the range, a held port is skipped.
    with socket.socket() as held:
        held.bind(("127.0.0.1", PORT_LOW + 7))
        held.listen()
        picks = iter([7, 7, *range(100, 164)])
        monkeypatch.setattr(local.secrets, "randbelow", lambda n: next(picks))
        assert PORT_LOW + 100 <= local.free_local_port() < PORT_LOW + 164
    monkeypatch.undo()
    ports = {local.free_local_port() for _ in range(20)}
    assert all(PORT_LOW <= p < PORT_HIGH for p in ports) and len(ports) > 1
