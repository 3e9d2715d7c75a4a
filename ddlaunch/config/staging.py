"""Rules of ``storage.stage`` and ``{node}`` in storage paths (pure; ``config.validate`` adds
the file and line). Where a data set lands on a node is ``planning.staging``'s business."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

NODE = "{node}"
_FIELD = re.compile(r"\{[^}]*\}")

Issue = tuple[tuple[str, ...], str]


def placeholders_issue(text: str) -> str | None:
    """Only ``{node}`` may be substituted: any other ``{...}`` is a typo that would reach the
    disk as literal braces."""
    other = [f for f in _FIELD.findall(text) if f != NODE]
    if other:
        return f"only {NODE} is replaced (by the node's hostname), not {other[0]}"
    return None


def issues(cfg: Any) -> list[Issue]:
    out: list[Issue] = []
    scratch = cfg.storage.scratch
    if scratch is not None:
        problem = placeholders_issue(scratch)
        if problem:
            out.append((("storage", "scratch"), problem))
    names: dict[str, int] = {}
    for i, item in enumerate(cfg.storage.stage):
        out += _item_issues(i, item, scratch)
        if item.name:
            upper = item.name.upper()
            if upper in names:
                out.append(
                    (
                        ("storage", "stage", str(i), "name"),
                        f"{item.name!r} is staged already (entry {names[upper]}): "
                        f"both would be DDLAUNCH_DATA_{upper}",
                    )
                )
            names.setdefault(upper, i)
    return out


def _item_issues(i: int, item: Any, scratch: str | None) -> list[Issue]:
    def at(key: str) -> tuple[str, ...]:
        return ("storage", "stage", str(i), key)

    out: list[Issue] = []
    if not item.name:
        out.append((at("name"), "missing: each entry needs a name (DDLAUNCH_DATA_<NAME>)"))
    if not item.src:
        out.append((at("src"), "missing: the path of the data on the shared filesystem"))
    elif not PurePosixPath(item.src).is_absolute():
        out.append((at("src"), f"must be an absolute path, got {item.src!r}"))
    elif NODE in item.src:
        # The source is one path every node reads as written: a {node} there would reach the
        # disk as literal braces, and no node would find it.
        out.append((at("src"), f"{NODE} is replaced in storage.scratch and dst, not in src"))
    if item.dst is not None:
        if not PurePosixPath(item.dst).is_absolute():
            out.append((at("dst"), f"must be an absolute path, got {item.dst!r}"))
        problem = placeholders_issue(item.dst)
        if problem:
            out.append((at("dst"), problem))
    elif scratch is None:
        out.append((at("dst"), "set dst, or storage.scratch for the default <scratch>/data/..."))
    target = item.dst if item.dst is not None else scratch or ""
    if item.mode == "sbcast" and NODE in target:
        key = "dst" if item.dst is not None else "mode"
        out.append(
            (
                at(key),
                f"sbcast writes the same path on every node, so the destination cannot "
                f"contain {NODE} (use mode copy or rsync)",
            )
        )
    return out
