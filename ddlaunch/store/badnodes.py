"""The per-user bad-node list: nodes to keep out of later submissions, with reason and expiry.

Stored in ``$DDLAUNCH_BAD_NODES`` or ``$XDG_CONFIG_HOME/ddlaunch/bad_nodes.json`` (default
``~/.config/ddlaunch/bad_nodes.json``): the home directory is shared with the compute nodes on
Slurm clusters, so a job that blames a node can record it where the next ``submit`` reads it.
Entries are a list of ``{"node", "reason", "added", "expires", "source"}``; ``expires`` null
means "until removed". The entry logic is pure (``add``, ``remove``, ``active``); ``load`` and
``save`` are the only I/O, and every write is atomic.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.config.schema import PATTERNS

ENV_PATH = "DDLAUNCH_BAD_NODES"


@dataclass(frozen=True)
class BadNode:
    node: str
    reason: str
    added: float
    expires: float | None = None
    source: str = "user"

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires <= now

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_path() -> Path:
    explicit = os.environ.get(ENV_PATH)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
    return Path(base).expanduser() / "ddlaunch" / "bad_nodes.json"


def _parse(raw: Any) -> list[BadNode]:
    entries = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not item.get("node"):
            continue  # a hand-edited file with junk in it must not break submit
        expires = item.get("expires")
        entries.append(
            BadNode(
                node=str(item["node"]),
                reason=str(item.get("reason", "")),
                added=float(item.get("added", 0.0) or 0.0),
                expires=float(expires) if expires is not None else None,
                source=str(item.get("source", "user")),
            )
        )
    return entries


def load(path: Path | None = None) -> list[BadNode]:
    try:
        return _parse(fsutil.read_json(path or default_path(), []))
    except (OSError, ValueError):
        return []


def save(entries: Sequence[BadNode], path: Path | None = None) -> Path:
    target = path or default_path()
    return fsutil.atomic_write_json(target, [e.as_dict() for e in entries], 0o600)


def add(
    entries: Sequence[BadNode],
    nodes: Iterable[str],
    *,
    reason: str,
    now: float,
    ttl_s: float | None,
    source: str = "user",
) -> list[BadNode]:
    """Add (or refresh) ``nodes``; a node listed already gets the new reason and expiry, and
    expired entries are dropped on the way."""
    names = set(nodes)
    expires = now + ttl_s if ttl_s else None
    kept = [e for e in entries if e.node not in names and not e.expired(now)]
    fresh = [BadNode(n, reason, now, expires, source) for n in sorted(names)]
    return sorted(kept + fresh, key=lambda e: e.node)


def remove(entries: Sequence[BadNode], nodes: Iterable[str]) -> list[BadNode]:
    names = set(nodes)
    return [e for e in entries if e.node not in names]


def active(entries: Sequence[BadNode], now: float) -> list[BadNode]:
    return [e for e in entries if not e.expired(now)]


def active_nodes(path: Path | None = None, now: float | None = None) -> list[str]:
    """Node names to exclude from a submission now."""
    return sorted({e.node for e in active(load(path), time.time() if now is None else now)})


def record(nodes: Iterable[str], reason: str, ttl_hours: float, source: str) -> None:
    """Add blamed nodes from a job (best effort: a job must never fail on this file)."""
    names = list(nodes)
    if not names or ttl_hours <= 0:
        return
    now = time.time()
    try:
        save(add(load(), names, reason=reason, now=now, ttl_s=ttl_hours * 3600, source=source))
    except OSError as exc:
        print(f"[ddlaunch] could not update the bad-node list: {exc}", flush=True)


def parse_ttl(text: str) -> float | None:
    """``30m``, ``12h``, ``2d``, ``3600`` (seconds) or ``never`` -> seconds (None: no expiry)."""
    value = text.strip().lower()
    if value in ("never", "none", "0", "forever"):
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (value[:-1], value[-1]) if value[-1] in units else (value, "s")
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 12h, 2d or never)") from None
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


def submittable_nodes(path: Path | None = None, now: float | None = None) -> list[str]:
    """Active entries that are safe to put in an ``#SBATCH --exclude`` line (Slurm tokens: a
    hand-edited file must not inject into the script)."""
    pattern, _ = PATTERNS["slurm_token"]
    return [n for n in active_nodes(path, now) if pattern.match(n)]
