"""Config errors that name the file, the line and the key path, and say what was expected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddlaunch.errors import UserError
from ddlaunch.wording import counted


@dataclass(frozen=True)
class ConfigIssue:
    """One problem with one key. ``where`` is ``file:line`` (``file:line:column`` for a YAML
    syntax error) or ``--set key=value``."""

    path: str
    message: str
    where: str | None = None

    def __str__(self) -> str:
        key = self.path or "(top level)"
        suffix = f" ({self.where})" if self.where else ""
        return f"{key}: {self.message}{suffix}"


class ConfigError(UserError):
    """Every problem found in a config, reported at once."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        lines = [f"invalid config ({counted(len(self.issues), 'error')}):"]
        lines += [f"  {issue}" for issue in self.issues]
        super().__init__("\n".join(lines))


def describe_value(value: Any) -> str:
    """``value`` as an error message names what was found instead of what was expected."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
