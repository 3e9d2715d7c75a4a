"""Trainers ddlaunch does not drive, torch-free: resume arguments (placeholders, replacing a
flag already given), the requeue matrix of the end hook (our stop + exit 0 -> requeue; exit 0
without it -> done; nonzero -> guarded by progress), no second requeue after the trainer's
own ``scontrol requeue``, the stop hook's wait for the save, stop_before_limit, the start
hook's choice of checkpoint and partial entries moved aside."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from support.fakes import FakeRunner
from support.rundirs import attempt_json, example_run_dir, write_attempts

from ddlaunch.app.prepare import prepare
from ddlaunch.config.validate import load_config, to_plain
from ddlaunch.job import hooks
from ddlaunch.job import stop as stopping
from ddlaunch.planning.resume import resume_values, with_resume_args
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, stops
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import checkpoint_source, committed_step
from ddlaunch.worker.trainer import trainer_args

JOB = AttemptId("9", 0, "9")
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("args", "resume", "expected"),
    [
        # HF: appended when absent
        (
            ["--lr", "3e-4"],
            ["--resume_from_checkpoint", "{checkpoint}"],
            ["--lr", "3e-4", "--resume_from_checkpoint", "/c/checkpoint-40"],
        ),
        # the same flag given already, as two words or as one: replaced, not duplicated
        (
            ["--resume_from_checkpoint", "/old", "--lr", "1"],
            ["--resume_from_checkpoint", "{checkpoint}"],
            ["--lr", "1", "--resume_from_checkpoint", "/c/checkpoint-40"],
        ),
        (
            ["--resume_from_checkpoint=/old", "pos"],
            ["--resume_from_checkpoint={checkpoint}"],
            ["pos", "--resume_from_checkpoint=/c/checkpoint-40"],
        ),
        # torchtune / Hydra overrides
        (
            ["--config", "llama.yaml", "resume_from_checkpoint=False", "epochs=2"],
            ["resume_from_checkpoint=True"],
            ["--config", "llama.yaml", "epochs=2", "resume_from_checkpoint=True"],
        ),
        # step and directory placeholders, a boolean flag, JSON braces left alone
        (
            ["--cfg", '{"a": 1}'],
            ["--resume", "--start-step", "{step}", "--dir={checkpoint_dir}"],
            ["--cfg", '{"a": 1}', "--resume", "--start-step", "40", "--dir=/c"],
        ),
    ],
)
def test_resume_args(args: list[str], resume: list[str], expected: list[str]) -> None:
    values = resume_values("/c/checkpoint-40", 40, "/c")
    assert with_resume_args(args, resume, values) == expected


def byo_run(tmp_path: Path, kind: str = "hf", **trainer: object) -> Path:
    """A run directory whose config launches a script with ``trainer.kind``."""
    sets = [
        "launch.entrypoint=null",
        "launch.script=train.py",
        f"trainer.kind={kind}",
        *[f"trainer.{k}={json.dumps(v)}" for k, v in trainer.items()],
    ]
    return example_run_dir(tmp_path, *sets, made="checkpoints")


def test_torchtune_resumes_with_the_recipe_states_epoch_files_named_as_on_disk(
    tmp_path: Path,
) -> None:
    """torchtune 0.6.1 looks checkpointer.checkpoint_files up in output_dir, so
    resume_from_checkpoint=True alone fails ("No file with name: model.pt found"); the files
    of the epoch recipe_state.pt belongs to (epochs_run 2: epoch_1) are named, as the recipe
    wrote them, replacing the files the script was given. epoch_2, saved after it, lacks
    its recipe state (being written): not resumed from."""
    import torch

    run = byo_run(tmp_path, "torchtune")
    cfg = load_config(run / "config.yaml")
    root = checkpoint_source(run).root
    for epoch in (0, 1, 2):
        (root / f"epoch_{epoch}").mkdir()
        (root / f"epoch_{epoch}" / "model-00001-of-00001.bin").write_text("w")
    (root / "recipe_state").mkdir()
    torch.save({"epochs_run": 2, "seed": 0}, root / "recipe_state" / "recipe_state.pt")
    cfg = replace(
        cfg, launch=replace(cfg.launch, args=("checkpointer.checkpoint_files=[model.pt]",))
    )
    env: dict[str, str] = {}
    assert trainer_args(cfg, run, env) == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files=[epoch_1/model-00001-of-00001.bin]",
    ]
    assert env["DDLAUNCH_RESUME_STEP"] == "1"
    assert env["DDLAUNCH_RESUME_CHECKPOINT"] == str(root / "epoch_1")


def hf_checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = run / "checkpoints" / f"checkpoint-{step}"
    path.mkdir()
    (path / "model.safetensors").write_text("x")
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def open_attempt(run: Path, resumed_from: int | None, attempt: AttemptId = JOB) -> None:
    records = attempt_json(run)
    records.append(
        attempts.new_record(
            len(records), attempt, nodes="node[1-2]", host="node1", resumed_from=resumed_from
        )
    )
    write_attempts(run, records)


SINFO = {"sinfo": "node1|allocated\nnode2|allocated\n"}


def requeued(runner: FakeRunner) -> bool:
    return ["scontrol", "requeue", "9"] in runner.calls


@pytest.mark.parametrize(
    ("asked", "exit_code", "after", "requeue", "cause", "decision"),
    [
        (True, 0, 60, True, "trainer stop", "requeue after trainer stop: committed step 40 -> 60"),
        (
            True,
            143,
            60,
            True,
            "trainer stop",
            "requeue after trainer stop: committed step 40 -> 60",
        ),
        (
            True,
            0,
            40,
            False,
            "trainer stop",
            "stopped: no progress in the last attempt (the committed step stayed at 40)",
        ),
        (False, 0, 60, False, "completed", "completed"),
        (False, 1, 60, True, "crash", "requeue after crash: committed step 40 -> 60"),
        (
            False,
            1,
            40,
            False,
            "crash",
            "stopped: no progress in the last attempt (the committed step stayed at 40)",
        ),
    ],
)
def test_end_hook_requeue_matrix(
    tmp_path: Path,
    asked: bool,
    exit_code: int,
    after: int,
    requeue: bool,
    cause: str,
    decision: str,
) -> None:
    run = byo_run(tmp_path)
    hf_checkpoint(run, 40)
    open_attempt(run, 40)
    if after != 40:
        hf_checkpoint(run, after)
    if asked:
        stops.write_stop(run, JOB, why="time limit in 120 s", signal="TERM")
    runner = FakeRunner({**SINFO, "scontrol show job": "JobId=9 JobState=RUNNING Restarts=0"})
    code = hooks.end(run, exit_code, SlurmClient(runner), JOB)
    record = attempt_json(run)[-1]
    assert (record["cause"], record["decision"], requeued(runner)) == (cause, decision, requeue)
    assert record["committed_step"] == after and record["exit_code"] == exit_code
    assert code == (0 if requeue else exit_code)
    if asked:
        assert record["signal"] == "TERM" and record["stop"] == "time limit in 120 s"
    if not requeue:
        outcome = json.loads((run / "outcome.json").read_text())
        assert outcome["state"] == {"trainer stop": "STOPPED", "completed": "COMPLETED"}.get(
            cause, "FAILED"
        )


def test_a_stop_asked_in_an_earlier_attempt_does_not_count(tmp_path: Path) -> None:
    run = byo_run(tmp_path)
    hf_checkpoint(run, 40)
    open_attempt(run, 40)
    stops.write_stop(run, AttemptId("9", 3, "9"), why="old")
    runner = FakeRunner(SINFO)
    hooks.end(run, 0, SlurmClient(runner), JOB)
    assert attempt_json(run)[-1]["cause"] == "completed"


def test_no_second_requeue_after_the_trainers_own(tmp_path: Path) -> None:
    """Lightning runs ``scontrol requeue`` itself after its hpc save: Slurm's restart count
    is past this attempt's by the time the end hook runs (measured on the dev cluster)."""
    run = byo_run(tmp_path, "lightning")
    open_attempt(run, None)
    ckpt = run / "checkpoints" / "hpc_ckpt_1.ckpt"
    import zipfile

    with zipfile.ZipFile(ckpt, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00X\x0b\x00\x00\x00global_stepq\x01K\x1es.")
    assert committed_step(run) == 30
    stops.write_stop(run, JOB, why="time limit in 120 s", signal="USR1")
    runner = FakeRunner({**SINFO, "scontrol show job": "JobId=9 JobState=PENDING Restarts=1"})
    assert hooks.end(run, 0, SlurmClient(runner), JOB) == 0
    record = attempt_json(run)[-1]
    assert record["decision"] == (
        "requeue after trainer stop: committed step none -> 30 (the trainer requeued the job)"
    )
    assert not requeued(runner)


def test_start_hook_closes_an_attempt_the_trainer_requeued(tmp_path: Path) -> None:
    run = byo_run(tmp_path, "lightning")
    open_attempt(run, None)
    stops.write_stop(run, JOB, why="time limit in 120 s", signal="USR1")
    nxt = AttemptId("9", 1, "9")
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node[1-2]"}
    hooks.start(run, SlurmClient(FakeRunner(SINFO)), nxt, env)
    first, second = attempt_json(run)
    assert first["cause"] == "trainer stop" and first["signal"] == "USR1"
    assert first["decision"] == "requeued by Slurm (the trainer's own scontrol requeue)"
    assert second["restart_count"] == 1 and second["resume_checkpoint"] is None


def test_start_hook_chooses_the_checkpoint_and_moves_the_partial_one(tmp_path: Path) -> None:
    run = byo_run(tmp_path)
    hf_checkpoint(run, 40)
    hf_checkpoint(run, 60, complete=False)  # kill -9 while HF wrote checkpoint-60
    write_attempts(
        run,
        [
            {
                "attempt": 0,
                "job_id": "9",
                "restart_count": 0,
                "nodes": "node1",
                "end": 5.0,
                "cause": "crash",
                "exit_code": 137,
                "resumed_from": None,
            }
        ],
    )
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node1"}
    hooks.start(run, SlurmClient(FakeRunner(SINFO)), AttemptId("9", 1, "9"), env)
    record = attempt_json(run)[-1]
    assert record["resumed_from"] == 40
    assert record["resume_checkpoint"] == str(run / "checkpoints" / "checkpoint-40")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-40"]
    aside = run / "checkpoints.ddlaunch-partial" / "checkpoint-60.9-1"
    assert (aside / "model.safetensors").read_text() == "x"  # kept, never deleted


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_stop_hook_forwards_the_signal_and_waits_for_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = byo_run(tmp_path)
    hf_checkpoint(run, 40)
    open_attempt(run, 40)
    clock, runner = Clock(), FakeRunner()
    start = clock.now

    def alive(pid: int | None) -> bool:
        if clock.now - start >= 4 and not (run / "checkpoints" / "checkpoint-47").exists():
            hf_checkpoint(run, 47)  # HF saved its jit checkpoint 4 s after the TERM
        return clock.now - start < 9  # and exited 5 s later

    monkeypatch.setattr(stopping, "alive", alive)
    request = stopping.StopRequest(
        run, JOB, checkpoint_source(run), SlurmClient(runner), 4242, clock, clock.sleep
    )
    record = request.run("time limit in 120 s", stopping.budget(120))
    assert runner.calls == [["scancel", "--signal=TERM", "9"]]  # once: it exited by itself
    assert record.saved_step == 47 and record.committed_before == 40
    assert stops.read_stop(run, JOB) == record


def test_the_save_on_the_signal_is_concluded_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like rank 0 of Session code after its signal save: the stop hook requeues as soon as
    the trainer's checkpoint is complete, without waiting for the trainer to exit."""
    run = byo_run(tmp_path)
    hf_checkpoint(run, 40)
    open_attempt(run, 40)
    clock = Clock()
    runner = FakeRunner({**SINFO, "scontrol show job": "JobId=9 JobState=RUNNING Restarts=0"})
    monkeypatch.setattr(stopping, "alive", lambda pid: True)  # HF would still be exiting
    request = stopping.StopRequest(
        run, JOB, checkpoint_source(run), SlurmClient(runner), 4242, clock, clock.sleep
    )
    request.on_saved = lambda stop: hooks.conclude_saved(
        run, SlurmClient(runner), JOB, hooks.HookSettings(), stop
    )
    monkeypatch.setattr(request, "sleep", lambda s: (clock.sleep(s), hf_checkpoint(run, 44)))
    record = request.run("time limit in 120 s", 105)
    assert record.saved_step == 44
    closed = attempt_json(run)[-1]
    assert (closed["cause"], closed["decision"]) == (
        "trainer stop",
        "requeue after trainer stop: committed step 40 -> 44",
    )
    assert runner.calls[-1] == ["scontrol", "requeue", "9"]
    assert runner.calls[0] == ["scancel", "--signal=TERM", "9"]  # the ask, never a stop
    assert hooks.end(run, 0, SlurmClient(runner), JOB) == 0  # the end hook finds it closed


@pytest.mark.parametrize(
    ("kind", "concludes"),
    [("hf", True), ("megatron", True), ("lightning", False), ("torchtune", False), ("dcp", False)],
)
def test_which_saves_end_the_attempt_at_once(tmp_path: Path, kind: str, concludes: bool) -> None:
    """Lightning requeues itself; torchtune and dcp/torchtitan have no save-on-signal."""
    run = byo_run(tmp_path, kind)
    request = stopping.StopRequest(run, JOB, checkpoint_source(run), SlurmClient(FakeRunner()), 1)
    request.on_saved = print
    assert request.concludes_on_save(checkpoint_source(run).layout.signal) is concludes


def test_stop_hook_stops_a_trainer_that_keeps_running_or_never_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = byo_run(tmp_path, "lightning")
    open_attempt(run, None)
    # Recorded on the dev cluster: `squeue -h -s -j JOB -o %i` of a running job.
    steps = (TESTS / "fixtures" / "slurm-22.05" / "squeue-steps.txt").read_text()
    clock, runner = Clock(), FakeRunner({"squeue -h -s": steps.replace("377", "9")})
    killed_at: list[float] = []
    runner.on_run = lambda argv: killed_at.append(clock.now) if "--signal=KILL" in argv else None
    # Hung in its save (Lightning saves inside its signal handler) and deaf to TERM; the
    # step ends once it is killed.
    monkeypatch.setattr(stopping, "alive", lambda pid: not killed_at)
    request = stopping.StopRequest(
        run, JOB, checkpoint_source(run), SlurmClient(runner), 4242, clock, clock.sleep
    )
    start = clock.now
    record = request.run("time limit in 60 s", stopping.budget(60))
    # USR1 for Lightning, TERM once the lead (60 s less the 15 s margin) ran out, KILL of the
    # step (never the batch step) 10 s later.
    assert runner.calls == [
        ["scancel", "--signal=USR1", "9"],
        ["scancel", "--signal=TERM", "9"],
        ["squeue", "-h", "-s", "-j", "9", "-o", "%i|%j"],
        ["scancel", "--signal=KILL", "9.1"],
    ]
    assert 55 < killed_at[0] - start < 56.5
    assert record.saved_step is None


def test_trainer_without_a_save_on_signal_is_stopped_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = byo_run(tmp_path, "torchtitan")
    open_attempt(run, None)
    clock, runner = Clock(), FakeRunner()
    monkeypatch.setattr(stopping, "alive", lambda pid: clock.now < 1003)
    request = stopping.StopRequest(
        run, JOB, checkpoint_source(run), SlurmClient(runner), 4242, clock, clock.sleep
    )
    request.run("time limit in 120 s", stopping.budget(120))
    assert runner.calls == [["scancel", "--signal=TERM", "9"]]


def test_stop_before_limit_after_a_checkpoint_when_the_next_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = byo_run(tmp_path, "hf", stop_before_limit=True)
    open_attempt(run, None)
    clock, runner = Clock(), FakeRunner()
    monkeypatch.setattr(stopping, "alive", lambda pid: False)
    request = stopping.StopRequest(
        run, JOB, checkpoint_source(run), SlurmClient(runner), 4242, clock, clock.sleep
    )
    watch = stopping.LimitWatch(request, deadline=clock.now + 1000)
    hf_checkpoint(run, 100)
    assert not watch.poll(clock.now)  # first checkpoint: no interval known yet
    clock.now += 400
    hf_checkpoint(run, 200)
    assert not watch.poll(clock.now)  # 600 s left > 400 s interval + margin
    clock.now += 400
    hf_checkpoint(run, 300)
    assert watch.poll(clock.now)  # 200 s left < 400 s: stop now rather than lose 200 s
    assert runner.calls == [["scancel", "--signal=TERM", "9"]]
    stop = stops.read_stop(run, JOB)
    assert stop is not None and (stop.why or "").startswith(
        "trainer.stop_before_limit: 200 s left, checkpoints every 400 s"
    )


def test_stop_window_warns_from_the_clusters_own_settings(tmp_path: Path) -> None:
    """KillWait, GraceTime and PreemptMode read once at submit (recorded from the dev
    cluster, with a preempting partition), compared with trainer.save_seconds."""
    from ddlaunch.app.submit import stop_window_warnings

    sets = [
        "launch.entrypoint=null",
        "launch.script=train.py",
        "trainer.kind=hf",
        "trainer.save_seconds=40",
        "fault_tolerance.signal_lead=50",
    ]
    prepared = prepare("examples/mlp", sets, run_id="r", run_root=str(tmp_path))
    runner = FakeRunner(
        {
            "scontrol show config": "KillWait                = 5 sec\nPreemptMode = OFF\n",
            "scontrol show partition": "PartitionName=debug Default=YES GraceTime=30 "
            "PreemptMode=REQUEUE State=UP\n",
        }
    )
    assert stop_window_warnings(prepared, runner) == [
        "fault_tolerance.signal_lead=50 s leaves 35 s to save (ddlaunch keeps 15 s for the "
        "requeue), less than one step plus a save (trainer.save_seconds=40)",
        "a preemption (PreemptMode=REQUEUE) gives the trainer 30 s (GraceTime) between TERM "
        "and SIGKILL, less than trainer.save_seconds=40: a preempted attempt resumes from its "
        "previous checkpoint",
        "KillWait=5 s: a cancel or a node's TERM leaves the trainer less than "
        "trainer.save_seconds=40 to save",
    ]
    assert runner.count("scontrol") == 2
    roomy = prepare("examples/mlp", [*sets[:-2], "trainer.save_seconds=3"], run_id="r2",
                    run_root=str(tmp_path))  # fmt: skip
    quiet = FakeRunner({"scontrol show config": "KillWait = 5 sec\nPreemptMode = OFF\n"})
    assert stop_window_warnings(roomy, quiet) == []
    session = prepare("examples/mlp", run_id="r3", run_root=str(tmp_path))
    none_asked = FakeRunner()
    assert stop_window_warnings(session, none_asked) == [] and none_asked.calls == []


def test_trainer_checkpoint_dir_is_made_absolute_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCRATCH", "/scratch/me")
    sets = ["launch.entrypoint=null", "launch.script=t.py", "trainer.kind=hf"]
    prepared = prepare(
        "examples/mlp",
        [*sets, "trainer.checkpoint_dir=$SCRATCH/{run_id}/hf"],
        run_id="r",
        run_root=str(tmp_path),
    )
    assert prepared.config.trainer.checkpoint_dir == "/scratch/me/{run_id}/hf"
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(prepared.config), sort_keys=False))
    assert checkpoint_source(run).root == Path("/scratch/me/r/hf")
    assert "--output_dir" not in prepared.plan.rank_command  # nothing invented


def test_report_and_resume_see_the_trainers_checkpoints(tmp_path: Path) -> None:
    from ddlaunch.app.report import checkpoint_times
    from ddlaunch.app.runs import read_run

    run = byo_run(tmp_path)
    for step in (20, 40):
        hf_checkpoint(run, step)
    hf_checkpoint(run, 60, complete=False)
    write_attempts(run, [{"attempt": 0, "job_id": "9", "start": 1.0, "end": 2.0}])
    info = read_run(run)
    assert (info.trainer, info.latest_step) == ("hf", 40)
    assert info.latest_checkpoint == run / "checkpoints" / "checkpoint-40"
    assert [step for step, _ in sorted(checkpoint_times(run))] == [20, 40]
