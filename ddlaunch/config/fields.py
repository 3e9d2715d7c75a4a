"""``opt``: how a schema field is declared (its default, one-line doc and checks)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any = None, doc: str = "", **checks: Any) -> Any:
    """A schema field: its default, its one-line doc and its checks."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"doc": doc, **checks})
    if isinstance(default, list):  # frozen configs hold tuples, with the list's items
        items = tuple(default)
        return field(default_factory=lambda: items, metadata={"doc": doc, **checks})
    return field(default=default, metadata={"doc": doc, **checks})
