"""The ``trainer:`` section of the config schema: how the job's own checkpoints look (a kind,
or the layout fields ``custom`` uses), how the trainer resumes and what makes it save."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.config.fields import opt
from ddlaunch.config.trainers import KINDS


@dataclass(frozen=True, kw_only=True)
class TrainerSpec:
    kind: str | None = opt(
        None,
        "How the job's own checkpoints look: ddlaunch (Session), dcp, torchtitan, hf, "
        "lightning, megatron, deepspeed, torchtune, custom, none; unset: ddlaunch for "
        "launch.entrypoint, none otherwise.",
        choices=KINDS,
    )
    checkpoint_dir: str | None = opt(
        None,
        "Where the trainer writes its checkpoints: absolute, ~ or $VAR, may use {run_dir} and "
        "{run_id}; default the run's checkpoint directory ($DDLAUNCH_CHECKPOINT_DIR).",
    )
    resume_args: tuple[str, ...] | None = opt(
        None,
        "Added to launch.args when a complete checkpoint exists (a flag already there is "
        "replaced); placeholders {checkpoint}, {step}, {checkpoint_dir}, {checkpoint_files} "
        "(its model files as [a,b], relative to checkpoint_dir); unset: the kind's.",
    )
    signal: str | None = opt(
        None,
        "Signal the batch shell forwards to the ranks ahead of the time limit so the trainer "
        "saves and stops (TERM, USR1, USR2, INT, HUP, none); unset: the kind's.",
        choices=("TERM", "USR1", "USR2", "INT", "HUP", "none"),
    )
    requeues: bool | None = opt(
        None,
        "The trainer runs scontrol requeue itself after its save on the signal (Lightning's "
        "auto-requeue): ddlaunch then never requeues first; unset: the kind's.",
    )
    stop_before_limit: bool = opt(
        False,
        "After a new checkpoint, when less than one observed checkpoint interval is left "
        "before the time limit, stop and requeue instead of losing that interval.",
    )
    save_seconds: int | None = opt(
        None,
        "Your estimate of one step plus one checkpoint save, in seconds: submit warns when "
        "signal_lead, KillWait or a preemption's GraceTime leaves less.",
        range=(1, 86400),
    )
    pattern: str | None = opt(None, "Glob of the checkpoint entries in checkpoint_dir (custom).")
    step_regex: str | None = opt(
        None, "Regex matched against an entry's name; group 1 is its step (custom)."
    )
    requires: tuple[str, ...] | None = opt(
        None, "Files a checkpoint directory must hold to be complete (custom)."
    )
    forbids: tuple[str, ...] | None = opt(
        None, "Files whose presence means the checkpoint is still being written (custom)."
    )
    pointer: str | None = opt(
        None, "File in checkpoint_dir that names the latest checkpoint (custom)."
    )
    pointer_holds: str | None = opt(
        None,
        "What the pointer holds: the entry's name, its step, or the count of entries finished "
        "(it names step count - 1).",
        choices=("name", "step", "count"),
    )
    pointer_key: str | None = opt(
        None,
        "The pointer is a torch.save (zip) file: key of the saved dict that holds what it "
        "names, read without torch (custom).",
    )
    step_key: str | None = opt(
        None,
        "For torch.save (zip) files: key of the saved dict that holds the step, read without "
        "torch (custom).",
    )
    step_marker: str | None = opt(
        None, 'JSON file in a checkpoint whose "step" must equal the entry\'s (custom).'
    )
