"""Slurm host lists and tasks-per-node specs, expanded as Slurm does (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand_brackets(text: str) -> list[str]:
    """Expand every ``[...]`` group of one host pattern (cartesian product, left to right)."""
    open_at = text.find("[")
    if open_at < 0:
        return [text]
    close_at = text.find("]", open_at)
    if close_at < 0:
        raise ValueError(f"unbalanced '[' in host list entry {text!r}")
    prefix, body, rest = text[:open_at], text[open_at + 1 : close_at], text[close_at + 1 :]
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError(f"bad range {part!r} in host list entry {text!r}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"descending range {part!r} in host list entry {text!r}")
        # Slurm keeps the zero padding of the lower bound: gpu-[08-10] -> gpu-08 .. gpu-10.
        width = len(lo_text)
        numbers.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    tails = _expand_brackets(rest)
    return [f"{prefix}{n}{tail}" for n in numbers for tail in tails]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm host list: ``node[1-3,5]``, ``gpu-[01-02]``, ``a1,b[2-3]``."""
    entries: list[str] = []
    depth, start = 0, 0
    # Split on the commas that are outside brackets only.
    for i, char in enumerate(hostlist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            entries.append(hostlist[start:i])
            start = i + 1
    entries.append(hostlist[start:])
    hosts: list[str] = []
    for entry in entries:
        entry = entry.strip()
        if entry:
            hosts.extend(_expand_brackets(entry))
    return hosts


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's tasks-per-node spec: ``2(x3)`` -> [2, 2, 2]; ``2(x2),1`` -> [2, 2, 1]."""
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"bad tasks-per-node spec {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Iterable[str]) -> str:
    """The hostlist Slurm would write for ``names``: ``node[1-3,10],login`` (the inverse of
    ``expand_hostlist``; runs of consecutive numbers of one prefix and width joined, in
    numeric order, names without a number kept as they are)."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain: set[str] = set()
    for name in set(names):
        match = _NUMBERED.match(name)
        if match is None:
            plain.add(name)
            continue
        prefix, digits = match.groups()
        # "node01" and "node1" are different names: a width of its own unless unpadded.
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    parts = []
    for (prefix, width), numbers in sorted(groups.items()):
        spans: list[list[int]] = []
        for n in sorted(numbers):
            if spans and n == spans[-1][1] + 1:
                spans[-1][1] = n
            else:
                spans.append([n, n])
        text = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in spans]
        single = len(numbers) == 1
        parts.append(f"{prefix}{text[0]}" if single else f"{prefix}[{','.join(text)}]")
    return ",".join(parts + sorted(plain))
