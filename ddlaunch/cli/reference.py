"""``ddlaunch config-reference``: every key, its type, default and doc (from the schema)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import click


def reference_lines(cls: type, prefix: str = "") -> list[str]:
    lines: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        doc = f.metadata.get("doc", "")
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(f"{key}:  {doc}")
            lines += reference_lines(hints[f.name], f"{key}.")
            continue
        default: Any = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, tuple):
            default = list(default)
        type_name = str(hints[f.name]).replace("typing.", "")
        type_name = getattr(hints[f.name], "__name__", type_name)
        lines.append(f"  {key} ({type_name}, default {default!r}): {doc}")
    return lines


@click.command("config-reference")
def command() -> None:
    """Print every config key with its type, default and meaning."""
    from ddlaunch.config.schema import Config

    click.echo("\n".join(reference_lines(Config)))
