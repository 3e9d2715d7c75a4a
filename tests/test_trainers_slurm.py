"""Unmodified trainers from PyPI on the real dev cluster (CPU, gloo): one end-to-end test per
trainer and per failure, each asserting what was kept (the step resumed from, the final
weights), not merely that it ran. The combinatorics are in test_trainer_protocol.py.

* HF Trainer, 2 nodes x 1 rank: the time limit's signal (sent to the batch shell at a known
  step, as Slurm's ``--signal=B:USR2@lead`` would) -> TERM to the ranks, HF's jit
  checkpoint, requeued, resumed with ``--resume_from_checkpoint`` at exactly that step; the
  final global step and weights equal an uninterrupted run's.
* HF Trainer: a rank killed -9 while it writes its second checkpoint (after the first
  completed) -> requeued (progress made), resumed from the first, never from the partial
  one (moved aside, not deleted); final weights equal the uninterrupted run's.
* Lightning, 2 nodes: USR1 -> hpc_ckpt saved, Lightning's own ``scontrol requeue`` is the
  only requeue, both attempts recorded, resumed at the saved step, finished.
* DeepSpeed (ZeRO-2, fp32, CPU), 2 nodes x 1 rank: a rank killed -9 after its second
  checkpoint is complete (``latest`` names it) -> restarted in the allocation (progress made),
  the script resumes through its own ``engine.load_checkpoint`` from exactly that tag and
  finishes; final weights equal the uninterrupted run's.
* DeepSpeed, 2 nodes x 1 rank: the time limit's signal after its second checkpoint -> TERM
  (DeepSpeed has no save-on-signal: the steps since ``latest`` are lost), requeued, the script
  resumes from the tag ``latest`` names, ``status`` shows the steps; final weights equal the
  uninterrupted run's.
* torchtune 0.6.1's own recipe (``full_finetune_distributed.py``, FSDP2 over gloo, through
  ``trainer_scripts/torchtune_cpu.py``), 2 nodes x 1 rank: the time limit's signal in its third
  epoch -> TERM (torchtune has no save-on-signal), requeued, resumed from ``epoch_1`` (the
  epoch its ``recipe_state.pt`` belongs to) with that epoch's files named; the steps of the
  epoch that was cut short are trained again to the same losses, bit for bit.
* A script that crashes before any checkpoint: not requeued, ``status`` says why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from support.devcluster import run_ddlaunch, wait_for
from support.slurm_runs import REPO, submit

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
# Nothing is downloaded (the model is built from a config). One CPU thread per rank: torch's
# CPU kernels then reduce in a fixed order, so the weights can be compared bit for bit with a
# reference run elsewhere (the thread count differs between a Slurm task and a local rank).
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
}
HF_SCRIPT = REPO / "ddlaunch" / "examples" / "hf_trainer.py"
PL_SCRIPT = REPO / "ddlaunch" / "examples" / "lightning_train.py"
DS_SCRIPT = REPO / "ddlaunch" / "examples" / "deepspeed_train.py"
STEPS = 80
DS_STEPS = 40
DS_ENV = {**OFFLINE, "DS_ACCELERATOR": "cpu"}
TUNE_SCRIPT = REPO / "tests" / "trainer_scripts" / "torchtune_cpu.py"
TUNE_STEPS_PER_EPOCH = 8  # 32 lines, 2 ranks, batch 2


def trainer_config(tmp_path: Path, name: str, script: Path, args: list[str], **sections) -> Path:
    cfg: dict = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 1, "cpus_per_task": 2},
        "launch": {"script": str(script), "args": args, "backend": "gloo", "env": OFFLINE},
        "fault_tolerance": {"max_requeues": 3},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def hf_args(sleep: float = 0.2, save_steps: int = 20) -> list[str]:
    return [
        "--output_dir", "{checkpoint_dir}", "--max_steps", str(STEPS),
        "--save_steps", str(save_steps),
        "--step_sleep", str(sleep), "--enable_jit_checkpoint", "--result", "{run_dir}/result.json",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run: the same script and arguments as 2 local ranks."""
    tmp = tmp_path_factory.mktemp("hf-reference")
    config = trainer_config(tmp, "hf-ref", HF_SCRIPT, hf_args(0.0), trainer={"kind": "hf"})
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp / "runs"), **OFFLINE}
    proc = run_ddlaunch("submit", str(config), "--local", cwd=tmp, env=env, timeout=300)
    (run_dir,) = (tmp / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    # Local ranks leave through the same exit path as srun's tasks (worker.leave): a finished
    # HF rank never aborts in gloo's native teardown, so the run completes.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["global_step"] == STEPS and result["start_step"] == 0
    return result


def ds_args(sleep: float) -> list[str]:
    return [
        "--save_dir", "{checkpoint_dir}", "--max_steps", str(DS_STEPS), "--save_steps", "10",
        "--step_sleep", str(sleep), "--result", "{run_dir}/result.json",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def ds_reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted DeepSpeed run: the same script and arguments as 2 local ranks."""
    tmp = tmp_path_factory.mktemp("ds-reference")
    launch = {"env": DS_ENV}
    config = trainer_config(
        tmp, "ds-ref", DS_SCRIPT, ds_args(0.0), trainer={"kind": "deepspeed"}, launch=launch
    )
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp / "runs"), **DS_ENV}
    proc = run_ddlaunch("submit", str(config), "--local", cwd=tmp, env=env, timeout=300)
    (run_dir,) = (tmp / "runs").iterdir()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["global_step"], result["start_step"], result["world_size"]) == (DS_STEPS, 0, 2)
    return result


def rank_steps(text: str) -> list[int]:
    """The steps the example scripts print on rank 0 (``step N``)."""
    return [int(s) for s in re.findall(r"^step (\d+)$", text, re.M)]


def rank0_step(run_dir: Path) -> int:
    try:
        steps = rank_steps((run_dir / "logs" / "rank-0.out").read_text())
    except FileNotFoundError:
        return -1
    return steps[-1] if steps else -1


def attempts(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "attempts.json").read_text())


def test_hf_trainer_time_limit_signal_saves_requeues_and_resumes_at_that_step(
    slurm_cluster, slurm_job_cleanup, tmp_path, hf_reference
) -> None:
    # Periodic saves at 25, 50, 75: the save on the signal (around step 40) is none of them.
    args = hf_args(save_steps=25)
    config = trainer_config(tmp_path, "hf-signal", HF_SCRIPT, args, trainer={"kind": "hf"})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:USR2@120" in script and "trap ddlaunch_stop USR2" in script
    wait_for(lambda: rank0_step(run_dir) >= 30, 240, "step 30")
    signalled = time.monotonic()
    slurm_cluster.signal_job(job_id, "USR2", batch=True)  # what Slurm does at time - lead
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    print(f"signal -> completed in {time.monotonic() - signalled:.1f} s")
    first, second = attempts(run_dir)
    saved = first["committed_step"]
    assert first["cause"] == "trainer stop" and first["signal"] == "TERM"
    # Concluded by the stop hook once the save was complete (no exit code: Slurm ended the
    # trainer), or by the end hook if HF's exit 0 came first: requeued either way.
    assert first.get("exit_code") in (None, 0)
    assert first["decision"] == f"requeue after trainer stop: committed step none -> {saved}"
    stop = json.loads((run_dir / "stop.json").read_text())
    # The stop hook saw the save that followed the signal (HF's jit checkpoint)...
    assert stop["committed_before"] < saved == stop["saved_step"] and saved >= 30
    # ...and the first attempt stopped there: HF checks its flag at the step's callbacks, so
    # at most the step in flight ran past the save (and is recomputed after the resume).
    log = (run_dir / "logs" / "rank-0.out").read_text()
    first_attempt = log.split("--resume_from_checkpoint")[0]
    assert rank_steps(first_attempt)[-1] in (saved, saved + 1)
    assert second["cause"] == "completed" and second["resumed_from"] == saved
    assert second["resume_checkpoint"] == str(run_dir / "checkpoints" / f"checkpoint-{saved}")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == saved and result["global_step"] == STEPS
    assert result["weights_sha256"] == hf_reference["weights_sha256"]
    assert f"--resume_from_checkpoint {run_dir}/checkpoints/checkpoint-{saved}" in log
    status = run_ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    row = json.loads(status.stdout)[0]
    assert (row["state"], row["checkpoint_step"], row["attempts"]) == ("COMPLETED", STEPS, 2)


def test_hf_rank_killed_while_writing_a_checkpoint_resumes_from_the_complete_one(
    slurm_cluster, slurm_job_cleanup, tmp_path, hf_reference
) -> None:
    stall = REPO / "tests" / "trainer_scripts" / "hf_stall.py"
    config = trainer_config(
        tmp_path,
        "hf-kill",
        stall,
        hf_args(0.0),
        trainer={"kind": "hf"},
        launch={"env": {**OFFLINE, "STALL_STEP": "40"}},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    out = run_dir / "out"
    stalled = wait_for(
        lambda: sorted(out.glob("stalled-*.json")) if len(list(out.glob("stalled-*"))) == 2 else 0,
        240,
        "both ranks inside the save of checkpoint-40",
    )
    partial = run_dir / "checkpoints" / "checkpoint-40"
    assert (partial / "model.safetensors").exists() and not (
        partial / "trainer_state.json"
    ).exists()
    os.kill(json.loads(stalled[1].read_text())["pid"], signal.SIGKILL)  # kill -9 rank 1
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first, second = attempts(run_dir)
    assert (first["cause"], first["committed_step"]) == ("crash", 20)
    # Restarted in the allocation (a new srun step): the same job, its restart count unchanged.
    assert first["decision"] == (
        "restart in the allocation after crash: committed step none -> 20 (restart 1 of 3)"
    )
    assert second["in_allocation"] is True and second["restart_count"] == 0
    assert second["resumed_from"] == 20  # never the partial checkpoint-40
    assert second["resume_checkpoint"] == str(run_dir / "checkpoints" / "checkpoint-20")
    aside = run_dir / "checkpoints.ddlaunch-partial" / f"checkpoint-40.{job_id}-0.1"
    assert (aside / "model.safetensors").is_file()  # moved out of HF's way, not deleted
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == 20 and result["global_step"] == STEPS
    assert result["weights_sha256"] == hf_reference["weights_sha256"]


def _wait_for_global_step20(run_dir: Path, past: int) -> None:
    """Until `latest` names global_step20 and rank 0 has trained past step ``past``.
    DeepSpeed's rank 0 writes `latest` before the save's last barrier (not after the other
    ranks' optimizer shards): a step after the tag's, every rank has finished writing it."""
    latest = run_dir / "checkpoints" / "latest"
    wait_for(
        lambda: (
            latest.is_file()
            and latest.read_text() == "global_step20"
            and rank0_step(run_dir) > past
        ),
        240,
        "global_step20 complete",
        poll=0.1,
    )


def test_deepspeed_rank_killed_after_a_checkpoint_resumes_from_that_tag(
    slurm_cluster, slurm_job_cleanup, tmp_path, ds_reference
) -> None:
    # The example script, once it has written its pid (a kind: deepspeed rank sends no
    # heartbeats: the trainer is not hooked).
    config = trainer_config(
        tmp_path,
        "ds-kill",
        REPO / "tests" / "trainer_scripts" / "example_with_pid.py",
        ["deepspeed_train.py", *ds_args(0.3)],
        trainer={"kind": "deepspeed"},
        launch={"env": DS_ENV},
    )
    started = time.monotonic()
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    _wait_for_global_step20(run_dir, past=20)
    pid = int((run_dir / "out" / "pid-1").read_text())  # the first attempt's rank 1
    os.kill(pid, signal.SIGKILL)  # kill -9, between checkpoints
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    print(f"submitted -> completed in {time.monotonic() - started:.1f} s")
    first, second = attempts(run_dir)
    assert (first["cause"], first["committed_step"]) == ("crash", 20)
    assert first["decision"] == (
        "restart in the allocation after crash: committed step none -> 20 (restart 1 of 3)"
    )
    assert second["in_allocation"] is True and second["cause"] == "completed"
    assert second["resumed_from"] == 20
    assert second["resume_checkpoint"] == str(run_dir / "checkpoints" / "global_step20")
    # ddlaunch added no argument: the script found `latest` and loaded global_step20 itself.
    log = (run_dir / "logs" / "rank-0.out").read_text()
    steps = rank_steps(log)
    restart = steps.index(21, steps.index(21) + 1)  # the second attempt's first step
    assert steps[restart:] == list(range(21, DS_STEPS + 1)) and max(steps[:restart]) < 30
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == 20 and result["global_step"] == DS_STEPS
    assert result["weights_sha256"] == ds_reference["weights_sha256"]
    assert (run_dir / "checkpoints" / "latest").read_text() == f"global_step{DS_STEPS}"


@pytest.mark.lane
def test_lightning_usr1_saves_hpc_checkpoint_and_requeues_exactly_once(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    # Lightning saves inside its signal handler, on each rank wherever the signal finds it;
    # with a rank inside the gradients' all-reduce and the other in the save's barrier, that
    # deadlocked here (tests/FLAKES.md). The ranks' agreed stop step (worker.lightning_stop)
    # moves the save to a batch end every rank reaches; test_lightning_agreed_stop.py makes
    # the disagreement certain. Most of each step here is idle time, as a GPU step is for the
    # CPU.
    args = [
        "--root", "{checkpoint_dir}", "--max_steps", "150", "--nodes", "2", "--devices", "1",
        "--step_sleep", "0.3", "--result", "{run_dir}/result.json",
    ]  # fmt: skip
    config = trainer_config(tmp_path, "pl-signal", PL_SCRIPT, args, trainer={"kind": "lightning"})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: rank0_step(run_dir) >= 40, 240, "step 40")
    slurm_cluster.signal_job(job_id, "USR2", batch=True)
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    assert slurm_cluster.job_field(job_id, "Restarts") == "1"  # Lightning's requeue only
    first, second = attempts(run_dir)
    saved = first["committed_step"]
    assert first["cause"] == "trainer stop" and first["signal"] == "USR1"
    # Measured: Lightning's scontrol requeue ends the batch shell too, so the next start hook
    # closes the attempt; the end hook, had it run, would have seen Restarts=1 and not
    # requeued again (test_trainer_protocol).
    assert first["decision"] == "requeued by Slurm (the trainer's own scontrol requeue)"
    assert saved >= 40
    assert second["resumed_from"] == saved and second["cause"] == "completed"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["hpc_ckpt_1.ckpt"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == saved and result["global_step"] == 150
    # The trainer's steps reach status through the ranks' heartbeats (worker.trainer_beats):
    # the step it trained to, where its last checkpoint's alone said `saved` when COMPLETED.
    row = json.loads(run_ddlaunch("status", run_dir.name, "--json", cwd=tmp_path).stdout)[0]
    assert (row["state"], row["step"]) == ("COMPLETED", 150), row


def tune_losses(text: str) -> list[tuple[int, str]]:
    """(step, loss) as torchtune's StdoutLogger prints them on rank 0."""
    return [(int(s), loss) for s, loss in re.findall(r"Step (\d+) \| loss:(\S+)", text)]


def test_deepspeed_time_limit_requeues_and_resumes_from_latest(
    slurm_cluster, slurm_job_cleanup, tmp_path, ds_reference
) -> None:
    config = trainer_config(
        tmp_path,
        "ds-limit",
        DS_SCRIPT,
        ds_args(0.3),
        trainer={"kind": "deepspeed"},
        launch={"env": DS_ENV},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:USR2@120" in script and "trap ddlaunch_stop USR2" in script
    _wait_for_global_step20(run_dir, past=22)
    slurm_cluster.signal_job(job_id, "USR2", batch=True)  # what Slurm does at time - lead
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    first, second = attempts(run_dir)
    saved = first["committed_step"]
    # No save on a signal: TERM at once, and the run goes on from the last tag it saved.
    assert (first["cause"], first["signal"]) == ("trainer stop", "none") and saved in (20, 30)
    assert first["decision"] == f"requeue after trainer stop: committed step none -> {saved}"
    assert (second["cause"], second["resumed_from"]) == ("completed", saved)
    assert second["resume_checkpoint"] == str(run_dir / "checkpoints" / f"global_step{saved}")
    steps = rank_steps((run_dir / "logs" / "rank-0.out").read_text())
    # The second attempt's first step is the last saved + 1 the log holds.
    again = len(steps) - 1 - steps[::-1].index(saved + 1)
    assert steps[again:] == list(range(saved + 1, DS_STEPS + 1))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == saved and result["global_step"] == DS_STEPS
    assert result["weights_sha256"] == ds_reference["weights_sha256"]
    status = run_ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    row = json.loads(status.stdout)[0]
    assert (row["state"], row["checkpoint_step"], row["attempts"]) == ("COMPLETED", DS_STEPS, 2)


@pytest.mark.skipif(
    importlib.util.find_spec("torchtune") is None,
    reason="torchtune is not installed (scripts/test-all installs torchtune 0.6.1 and torchao)",
)
def test_torchtune_time_limit_requeues_and_resumes_from_the_recipe_states_epoch(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    config = trainer_config(
        tmp_path,
        "tune-limit",
        TUNE_SCRIPT,
        ["{run_dir}/assets", "output_dir={checkpoint_dir}"],
        trainer={"kind": "torchtune"},
        launch={"env": {**OFFLINE, "TUNE_STEP_SLEEP": "0.2"}},
    )
    started = time.monotonic()
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    ckpt = run_dir / "checkpoints"
    log = run_dir / "logs" / "rank-0.out"

    def steps() -> int:
        found = tune_losses(log.read_text()) if log.exists() else []
        return found[-1][0] if found else 0

    # Two epochs saved (epoch_1 and the recipe state that names it), the third under way.
    wait_for(lambda: steps() >= 2 * TUNE_STEPS_PER_EPOCH + 3, 240, "step 19")
    slurm_cluster.signal_job(job_id, "USR2", batch=True)  # what Slurm does at time - lead
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    print(f"submitted -> completed in {time.monotonic() - started:.1f} s")
    first, second = attempts(run_dir)
    assert (first["cause"], first["signal"], first["committed_step"]) == ("trainer stop", "none", 1)
    assert first["decision"] == "requeue after trainer stop: committed step none -> 1"
    assert (second["cause"], second["resumed_from"]) == ("completed", 1)
    # The final epoch_3 is saved without recipe state: epoch_2 is the last one to resume from.
    assert second["committed_step"] == 2
    assert second["resume_checkpoint"] == str(ckpt / "epoch_1")
    text = log.read_text()
    resumed = (
        "resume_from_checkpoint=True "
        "checkpointer.checkpoint_files=[epoch_1/model-00001-of-00001.bin]"
    )
    assert resumed in text
    before, after = text.split(resumed, 1)
    cut_short, again = tune_losses(before), tune_losses(after)
    # The second attempt starts at epoch 2's first step with the weights, optimizer and data
    # order of the end of epoch 1: the steps the first attempt ran past epoch_1 (lost at the
    # stop) come out with the same losses.
    assert again[0][0] == 2 * TUNE_STEPS_PER_EPOCH + 1 and again[-1][0] == 4 * TUNE_STEPS_PER_EPOCH
    lost = [s for s in cut_short if s[0] > 2 * TUNE_STEPS_PER_EPOCH]
    assert len(lost) >= 3 and lost == again[: len(lost)]
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("epoch_")) == [
        "epoch_0", "epoch_1", "epoch_2", "epoch_3",
    ]  # fmt: skip


def test_script_crashing_before_any_checkpoint_is_not_requeued(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    crash = REPO / "tests" / "trainer_scripts" / "crash_early.py"
    config = trainer_config(tmp_path, "crash", crash, [], trainer={"kind": "hf"})
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "FAILED", timeout=180) == "FAILED"
    (only,) = attempts(run_dir)
    assert only["cause"] == "crash" and only["committed_step"] is None
    status = run_ddlaunch("status", run_dir.name, "--json", cwd=tmp_path)
    row = json.loads(status.stdout)[0]
    assert row["state"] == "FAILED" and row["attempts"] == 1
    assert row["detail"] == (
        "stopped: no progress in the last attempt (no checkpoint was ever committed)"
    )
    assert "FileNotFoundError: no such dataset: /data/missing" in row["failure"]
