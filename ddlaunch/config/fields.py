"""``opt``: how a schema field is declared (its default, one-line doc and checks)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any = None, doc: str = "", **checks: Any) -> Any:
    """A schema field: its default, its one-line doc and its checks."""
    if isinstance(default, list | dict):
        factory = (lambda d=default: type(d)(d)) if isinstance(default, dict) else tuple
        return field(default_factory=factory, metadata={"doc": doc, **checks})
    return field(default=default, metadata={"doc": doc, **checks})
