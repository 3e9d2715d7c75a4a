"""The per-user bad-node list: nodes to keep out of later submissions, with reason and expiry.

Stored in ``$DDLAUNCH_BAD_NODES`` or ``$XDG_CONFIG_HOME/ddlaunch/bad_nodes.json`` (default
``~/.config/ddlaunch/bad_nodes.json``): the home directory is shared with the compute nodes on
Slurm clusters, so a job that blames a node can record it where the next ``submit`` reads it.
Entries are a list of ``{"node", "reason", "added", "expires", "source", "suspect"}``;
``expires`` null means "until removed". The entry logic is pure (``add``, ``suspect``,
``remove``, ``active``); ``load`` and ``save`` are the only I/O, and every write is atomic.

The list takes a node only on evidence about the node: a failed preflight, a node death, a
straggler verdict (``record``). A hang is evidence about the code as much as the node (a
rank stuck in the training loop's own frame hangs on any node), so it makes the node a
*suspect* (``record_suspect``): listed but not excluded, until a second, different run
blames the same node, which lists it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
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
    suspect: bool = False  # blamed once by a hang: shown, not excluded

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires <= now

    def describe(self, now: float) -> str:
        """Why and until when, in one line (what ``submit`` says about an excluded node)."""
        added = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.added))
        return (
            f"on your bad-node list since {added} ({self.source}: {self.reason}), "
            f"{expiry(self.expires, now)}"
        )

    def as_dict(self) -> dict[str, object]:
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
                suspect=item.get("suspect") is True,
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


def suspect(
    entries: Sequence[BadNode],
    nodes: Iterable[str],
    *,
    reason: str,
    now: float,
    ttl_s: float | None,
    source: str,
) -> list[BadNode]:
    """Make ``nodes`` suspects; a node a different source suspected already (and that has
    not expired) is listed instead, with both reasons. A listed node stays listed."""
    current = {e.node: e for e in entries if not e.expired(now)}
    out = list(entries)
    for node in sorted(set(nodes)):
        known = current.get(node)
        if known is not None and not known.suspect:
            continue
        if known is not None and known.source != source:
            both = f"{reason}; before that {known.source}: {known.reason}"
            out = add(
                out,
                [node],
                reason=both,
                now=now,
                ttl_s=ttl_s,
                source=f"{source} and {known.source}",
            )
        else:
            out = add(out, [node], reason=reason, now=now, ttl_s=ttl_s, source=source)
            out = [replace(e, suspect=True) if e.node == node else e for e in out]
    return out


def expiry(expires: float | None, now: float) -> str:
    if expires is None:
        return "until removed"
    hours = (expires - now) / 3600
    return f"expires in {hours:.1f} h" if hours >= 1 else f"expires in {hours * 60:.0f} min"


def active(entries: Sequence[BadNode], now: float) -> list[BadNode]:
    """The entries that keep a node out now (suspects and expired ones do not)."""
    return [e for e in entries if not e.expired(now) and not e.suspect]


def suspects(entries: Sequence[BadNode], now: float) -> list[BadNode]:
    return [e for e in entries if not e.expired(now) and e.suspect]


def active_nodes(path: Path | None = None, now: float | None = None) -> list[str]:
    """Node names to exclude from a submission now."""
    return sorted({e.node for e in active(load(path), time.time() if now is None else now)})


def record(
    nodes: Iterable[str], reason: str, ttl_hours: float, source: str, *, suspected: bool = False
) -> None:
    """Add nodes a job blamed on evidence about them (best effort: a job must never fail on
    this file); ``suspected``: as suspects (``suspect``), for a hang."""
    names = list(nodes)
    if not names or ttl_hours <= 0:
        return
    now, ttl = time.time(), ttl_hours * 3600
    try:
        entries = load()
        if suspected:
            entries = suspect(entries, names, reason=reason, now=now, ttl_s=ttl, source=source)
        else:
            entries = add(entries, names, reason=reason, now=now, ttl_s=ttl, source=source)
        save(entries)
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


def submittable_entries(path: Path | None = None, now: float | None = None) -> list[BadNode]:
    """Active entries that are safe to put in an ``#SBATCH --exclude`` line (Slurm tokens: a
    hand-edited file must not inject into the script)."""
    pattern, _ = PATTERNS["slurm_token"]
    entries = active(load(path), time.time() if now is None else now)
    return [e for e in entries if pattern.match(e.node)]


def submittable_nodes(path: Path | None = None, now: float | None = None) -> list[str]:
    return sorted({e.node for e in submittable_entries(path, now)})
