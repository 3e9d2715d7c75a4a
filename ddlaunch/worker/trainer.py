"""What a rank runs for a trainer ddlaunch does not drive (``trainer.kind`` other than
ddlaunch and none): its ``launch.args`` with the run's directories filled in and, when a
complete checkpoint exists, ``trainer.resume_args`` for it.

Every rank of a Slurm attempt takes the checkpoint the start hook chose and recorded in the
attempt (after moving a partial newest one aside), so all ranks and ``attempts.json`` agree
on it; outside Slurm (``--local``) the rank finds it itself. The choice is also exported
(``DDLAUNCH_RESUME_CHECKPOINT``, ``DDLAUNCH_RESUME_STEP``, ``DDLAUNCH_TRAINER_CHECKPOINT_DIR``)
for scripts that prefer to read it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path

from ddlaunch.checkpoint.adapters import model_files
from ddlaunch.config.schema import Config
from ddlaunch.config.trainers import is_byo, placeholders, substitute
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.resume import resume_values, with_resume_args
from ddlaunch.store import attempts
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import checkpoint_source, latest_checkpoint
from ddlaunch.worker.gate import wait_for_attempt


def chosen_checkpoint(
    run_dir: Path, env: Mapping[str, str], root: Path
) -> tuple[str | None, int | None]:
    """(checkpoint path, step) this attempt resumes from; (None, None) from scratch."""
    if env.get("SUBMITIT_EXECUTOR") == "slurm" and env.get("SLURM_JOB_ID"):
        attempt = AttemptId.from_env(env)
        if wait_for_attempt(run_dir, attempt, timeout=60.0):
            record = attempts.load(run_dir)[-1]
            return record.resume_checkpoint or None, record.resumed_from
    found = latest_checkpoint(run_dir)
    return (str(found.path), found.step) if found else (None, None)


def torchtitan_ft_args(cfg: Config, env: Mapping[str, str]) -> list[str]:
    """torchtitan's own torchft flags for a rank of a replica group (its Manager reads the
    lighthouse and the manager port from the environment, torchft's names): each group is
    one torchtitan instance, as torchtitan's torchft guide runs it."""
    ident = GroupIdentity.from_env(env)
    if ident is None or cfg.trainer_kind != "torchtitan":
        return []
    return [
        "--fault_tolerance.enable",
        f"--fault_tolerance.replica_id={ident.group}",
        f"--fault_tolerance.group_size={ident.groups}",
        f"--fault_tolerance.min_replica_size={cfg.fault_tolerance.min_replica_groups}",
    ]


def trainer_args(cfg: Config, run_dir: Path, env: MutableMapping[str, str]) -> list[str]:
    """``launch.args`` as this rank runs them (unchanged for ddlaunch and none)."""
    args = list(cfg.launch.args)
    if not is_byo(cfg.trainer_kind):
        return args
    args += torchtitan_ft_args(cfg, env)
    root = checkpoint_source(run_dir).root
    dirs = {"checkpoint_dir": str(root), "run_dir": str(run_dir), "run_id": run_dir.name}
    args = [substitute(word, dirs) for word in args]
    env["DDLAUNCH_TRAINER_CHECKPOINT_DIR"] = str(root)
    checkpoint, step = chosen_checkpoint(run_dir, env, root)
    if checkpoint is None:
        return args
    env["DDLAUNCH_RESUME_CHECKPOINT"] = checkpoint
    env["DDLAUNCH_RESUME_STEP"] = "" if step is None else str(step)
    resume = cfg.trainer_layout.resume_args
    files = model_files(Path(checkpoint), root) if _names_files(resume) else []
    return with_resume_args(args, resume, resume_values(checkpoint, step, str(root), files))


def _names_files(resume_args: tuple[str, ...]) -> bool:
    return any("checkpoint_files" in placeholders(word) for word in resume_args)


def describe(cfg: Config, args: list[str]) -> str:
    """What this rank runs, in one line (the rank-0 log)."""
    launch = cfg.launch
    if launch.entrypoint:
        return f"entry point {launch.entrypoint}(config)"
    what = f"-m {launch.module}" if launch.module else str(launch.script)
    return " ".join([launch.python, what, *args]).replace("\n", " ")
