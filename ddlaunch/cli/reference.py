"""``ddlaunch config-reference``: every key, its type, default and doc (from the schema)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import click


def type_label(tp: Any) -> str:
    """Readable YAML-side type names: tuple[str, ...] is a list in the config file."""
    text = str(tp).replace("typing.", "")
    text = text.replace("tuple[str, ...]", "list of str").replace("dict[str, Any]", "mapping")
    text = text.replace("dict[str, str]", "mapping of str").replace(" | None", " or null")
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else text


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
        item = typing.get_args(hints[f.name])[:1]
        if item and isinstance(item[0], type) and dataclasses.is_dataclass(item[0]):
            # storage.stage under its section; components at the top, a heading whose
            # items' keys (their sections' headings too) are indented under it.
            lines.append(f"{'  ' if prefix else ''}{key} (list of mappings, default []): {doc}")
            items = reference_lines(item[0], f"{key}[].")
            lines += [line if line.startswith("  ") else f"  {line}" for line in items]
            continue
        default: Any = f.default
        if default is dataclasses.MISSING and callable(f.default_factory):
            default = f.default_factory()
        if isinstance(default, tuple):
            default = list(default)
        # A key under a section is indented under its heading; a top-level key (sbatch,
        # params) is not, or it would read as the previous section's last key.
        indent = "  " if prefix else ""
        label = f.metadata.get("type_label") or type_label(hints[f.name])
        lines.append(f"{indent}{key} ({label}, default {default!r}): {doc}")
    return lines


@click.command("config-reference")
def command() -> None:
    """Print every config key with its type, default and meaning."""
    from ddlaunch.config.schema import Config

    click.echo("\n".join(reference_lines(Config)))
