"""How the checkpoints of the trainers people already use look on disk: adapters as data.

A ``Layout`` says which entries of a checkpoint directory are checkpoints (a glob and a regex
whose first group is the step), when one is complete (files it must hold, files that mark it
as being written, a pointer file naming the latest, a step recorded inside), how the trainer
is told to resume, and which signal makes it save and stop. The built-in kinds below are
instances of exactly the fields a ``trainer.kind: custom`` config sets; discovery on disk is
``ddlaunch.checkpoint.adapters`` (torch-free), the resume arguments ``planning.resume``.

Pure data, no I/O: config validation resolves a config's trainer section into a ``Layout``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, cast

KIND_DDLAUNCH = "ddlaunch"  # ddlaunch.train.Session: the default for launch.entrypoint
KIND_NONE = "none"  # nothing known about the checkpoints: the default for scripts and modules
KIND_CUSTOM = "custom"
NO_SIGNAL = "none"

#: Placeholders ``trainer.resume_args`` may use. ``{checkpoint_files}``: the checkpoint's
#: model shard files (``model-00001-of-00002.safetensors``, ...), relative to the checkpoint
#: directory, as a list override (``[epoch_1/model-00001-of-00002.safetensors, ...]``).
RESUME_PLACEHOLDERS = ("checkpoint", "step", "checkpoint_dir", "checkpoint_files")
#: Placeholders ``trainer.checkpoint_dir`` may use (expanded per run, so sweep members differ).
DIR_PLACEHOLDERS = ("run_dir", "run_id")
#: Placeholders expanded in ``launch.args`` of a trainer kind other than ddlaunch and none
#: (``{checkpoint_dir}``: the trainer's checkpoint directory). Other braces stay as written.
ARGS_PLACEHOLDERS = ("checkpoint_dir", "run_dir", "run_id")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Layout:
    """One trainer's checkpoint layout and protocol (all fields are config keys of
    ``trainer:``; a built-in kind is a set of values for them)."""

    pattern: str = ""  # glob of the checkpoint entries in the checkpoint directory
    step_regex: str = ""  # matched against an entry's name; group 1 is the step
    requires: tuple[str, ...] = ()  # files an entry (a directory) must hold to be complete
    forbids: tuple[str, ...] = ()  # files whose presence means the entry is being written
    pointer: str | None = None  # file in the directory naming the latest checkpoint
    # What the pointer holds: the entry's "name", its "step", or the "count" of entries
    # finished (torchtune's epochs_run: it names step count - 1).
    pointer_holds: str = "name"
    pointer_key: str | None = None  # a torch.save (zip) pointer: the saved dict's key to read
    step_key: str | None = None  # zip (torch.save) file: the pickled dict's key with the step
    step_marker: str | None = None  # JSON file in the entry whose "step" must match
    resume_args: tuple[str, ...] = ()  # added to launch.args when a checkpoint exists
    signal: str = NO_SIGNAL  # the signal the trainer saves and stops on ("none": no handler)
    requeues: bool = False  # it runs `scontrol requeue` itself after that save (Lightning)

    @property
    def knows_checkpoints(self) -> bool:
        return bool(self.pattern and self.step_regex)

    @property
    def has_marker(self) -> bool:
        """Whether a complete entry can be told from one cut off mid-write. Without a marker
        the newest entry of an attempt that did not end cleanly is moved aside before a
        restart (never deleted)."""
        return bool(self.requires or self.pointer or self.step_key or self.step_marker)


#: Layout fields a config may set (for ``custom``, or to adjust a built-in kind).
LAYOUT_KEYS = tuple(f.name for f in fields(Layout))

BUILTIN: dict[str, Layout] = {
    KIND_DDLAUNCH: Layout(
        pattern="step-*",
        step_regex=r"^step-([0-9]+)$",
        requires=(".metadata", ".ddlaunch-commit.json"),
        step_marker=".ddlaunch-commit.json",
    ),
    "dcp": Layout(pattern="step-*", step_regex=r"^step-([0-9]+)$", requires=(".metadata",)),
    "torchtitan": Layout(pattern="step-*", step_regex=r"^step-([0-9]+)$", requires=(".metadata",)),
    "hf": Layout(
        pattern="checkpoint-*",
        step_regex=r"^checkpoint-([0-9]+)$",
        requires=("trainer_state.json",),
        forbids=("checkpoint-is-incomplete.txt",),
        resume_args=("--resume_from_checkpoint", "{checkpoint}"),
        signal="TERM",  # TrainingArguments(enable_jit_checkpoint=True)
    ),
    "lightning": Layout(
        pattern="*.ckpt",
        # hpc_ckpt_<N>.ckpt (N counts saves, not steps) and last*.ckpt; the step is read
        # from the file's global_step, without torch.
        step_regex=r"^(?:hpc_ckpt_([0-9]+)|last(?:-v[0-9]+)?)\.ckpt$",
        step_key="global_step",
        signal="USR1",  # SLURMEnvironment(auto_requeue=True), Lightning's default
        requeues=True,
    ),
    "megatron": Layout(
        pattern="iter_*",
        step_regex=r"^iter_([0-9]+)$",
        pointer="latest_checkpointed_iteration.txt",
        pointer_holds="step",
        signal="TERM",  # --exit-signal-handler
    ),
    "deepspeed": Layout(
        pattern="global_step*",
        step_regex=r"^global_step([0-9]+)$",
        pointer="latest",
        pointer_holds="name",
    ),
    "torchtune": Layout(
        pattern="epoch_*",
        step_regex=r"^epoch_([0-9]+)$",
        # resume_from_checkpoint=True loads recipe_state/recipe_state.pt (the optimizer, the
        # data loader, epochs_run), rewritten at the end of every epoch but the last, after
        # epoch_<N>/'s weights: the epoch it belongs to (epochs_run - 1) is the one to resume
        # from; a newer epoch_<N>/ is being written, or is the final one (no recipe state).
        pointer="recipe_state/recipe_state.pt",
        pointer_holds="count",
        pointer_key="epochs_run",
        # torchtune looks the checkpoint files up in output_dir: alone, resume_from_checkpoint
        # fails ("No file with name: model.pt found in <output_dir>", 0.6.1), so that epoch's
        # files are named as they are on disk.
        resume_args=(
            "resume_from_checkpoint=True",
            "checkpointer.checkpoint_files={checkpoint_files}",
        ),
    ),
    KIND_CUSTOM: Layout(),
    KIND_NONE: Layout(),
}
KINDS = tuple(BUILTIN)


def default_kind(entrypoint: str | None) -> str:
    """``trainer.kind`` when unset: Session code for an entry point, nothing known else."""
    return KIND_DDLAUNCH if entrypoint else KIND_NONE


def resolve(kind: str, overrides: Mapping[str, object]) -> Layout:
    """The built-in layout of ``kind`` with the config's own values (unset ones: ``None``)."""
    base = BUILTIN[kind]
    given = {k: v for k, v in overrides.items() if k in LAYOUT_KEYS and v is not None}
    for key in ("requires", "forbids", "resume_args"):
        if key in given:
            value = given[key]
            if not isinstance(value, Iterable):
                raise TypeError(f"trainer.{key}: not a list")
            given[key] = tuple(value)
    # The kinds are the config's: checked by ``config.validate``, or as YAML read them back.
    return replace(base, **cast(Mapping[str, Any], given))


def is_byo(kind: str) -> bool:
    """A trainer ddlaunch does not drive itself: its checkpoints are found by the layout, its
    stop is asked by the batch shell."""
    return kind not in (KIND_DDLAUNCH, KIND_NONE)


def placeholders(text: str) -> list[str]:
    return PLACEHOLDER_RE.findall(text)


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace ``{name}`` for the names in ``values``; other braces are left as they are
    (arguments may hold JSON)."""
    return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def section_of(tree: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A section of a config read as plain YAML: absent or null is empty; ``TypeError`` when
    it is not a mapping (a config edited or damaged since ddlaunch wrote it)."""
    value = tree.get(key) or {}
    if not isinstance(value, dict):
        raise TypeError(f"{key}: {type(value).__name__} where a mapping is expected")
    return value


def layout_from_tree(tree: Mapping[str, object]) -> tuple[str, Layout]:
    """(kind, layout) from a resolved config read as plain YAML (the hooks, ``status``),
    without validating the whole config."""
    if "trainer" not in tree:
        # Written before the section existed: ddlaunch's own layout, as it was read then.
        return KIND_DDLAUNCH, BUILTIN[KIND_DDLAUNCH]
    section = section_of(tree, "trainer")
    entrypoint = section_of(tree, "launch").get("entrypoint")
    found = section.get("kind") or default_kind(str(entrypoint) if entrypoint else None)
    kind = found if isinstance(found, str) and found in BUILTIN else KIND_NONE
    return kind, resolve(kind, section)
