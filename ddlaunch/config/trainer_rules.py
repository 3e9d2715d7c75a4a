"""Rules of the ``trainer:`` section that involve more than one key: the kind fits the
launch, a custom layout is complete, templates use known placeholders only."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ddlaunch.config import trainers
from ddlaunch.config.schema import Config

Fail = Callable[..., None]  # validate._Builder.fail: (key path, message, also=key path)
_T = ("trainer",)


def check(cfg: Config, fail: Fail) -> None:
    kind = cfg.trainer_kind
    if kind == trainers.KIND_DDLAUNCH and cfg.launch.entrypoint is None:
        fail((*_T, "kind"), "ddlaunch (Session) needs launch.entrypoint")
    if trainers.is_byo(kind):
        _layout_rules(cfg.trainer, kind, fail)
    else:
        _unused_rules(cfg.trainer, kind, fail)
    _resume_args_rule(cfg.trainer.resume_args or (), fail)
    _dir_rule(cfg.trainer.checkpoint_dir, fail)


def _unused_rules(t: Any, kind: str, fail: Fail) -> None:
    for key in (
        "resume_args",
        "signal",
        "requeues",
        "pattern",
        "step_regex",
        "pointer",
        "pointer_key",
        "step_key",
    ):
        if getattr(t, key) is not None:
            fail((*_T, key), f"has no effect with trainer.kind={kind}", also=(*_T, "kind"))
    if t.stop_before_limit and kind == trainers.KIND_NONE:
        fail(
            (*_T, "stop_before_limit"),
            "needs a trainer.kind whose checkpoints ddlaunch can find",
            also=(*_T, "kind"),
        )


def _layout_rules(t: Any, kind: str, fail: Fail) -> None:
    if kind == trainers.KIND_CUSTOM:
        for key, example in (("pattern", "ckpt-*"), ("step_regex", "^ckpt-([0-9]+)$")):
            if not getattr(t, key):
                fail(
                    (*_T, key),
                    f"is required with trainer.kind=custom (e.g. {example})",
                    also=(*_T, "kind"),
                )
    if t.step_regex is not None:
        try:
            groups = re.compile(t.step_regex).groups
        except re.error as exc:
            fail((*_T, "step_regex"), f"is not a valid regex: {exc}")
        else:
            if groups < 1:
                fail(
                    (*_T, "step_regex"),
                    "needs a group that captures the step, e.g. ^ckpt-([0-9]+)$",
                )
    for key in ("pointer_holds", "pointer_key"):
        if (
            getattr(t, key) is not None
            and not trainers.resolve(kind, {"pointer": t.pointer}).pointer
        ):
            fail((*_T, key), "needs trainer.pointer")


def _resume_args_rule(values: tuple[str, ...], fail: Fail) -> None:
    known = ", ".join(f"{{{p}}}" for p in trainers.RESUME_PLACEHOLDERS)
    for value in values:
        unknown = [p for p in trainers.placeholders(value) if p not in trainers.RESUME_PLACEHOLDERS]
        if unknown:
            fail(
                (*_T, "resume_args"),
                f"unknown placeholder {{{unknown[0]}}} in {value!r}; use {known}",
            )
            return


def _dir_rule(value: str | None, fail: Fail) -> None:
    if value is None:
        return
    path = (*_T, "checkpoint_dir")
    unknown = [p for p in trainers.placeholders(value) if p not in trainers.DIR_PLACEHOLDERS]
    if unknown:
        names = ", ".join(f"{{{p}}}" for p in trainers.DIR_PLACEHOLDERS)
        fail(path, f"unknown placeholder {{{unknown[0]}}}; use {names}")
    elif not value.startswith(("/", "~", "$", "{run_dir}")):
        fail(
            path,
            f"must be an absolute path (or start with ~, $VAR or {{run_dir}}), got {value!r}",
        )
