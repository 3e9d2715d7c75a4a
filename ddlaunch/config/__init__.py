"""Config model: schema, loading with presets and overrides, validation with precise errors.

The package's names are resolved on first use (PEP 562): importing one of its light modules
(``config.trainers``, which the login node's checkpoint discovery uses) must not load the
validator and YAML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddlaunch.config.errors import ConfigError, ConfigIssue
    from ddlaunch.config.schema import Config
    from ddlaunch.config.validate import load_config, parse_duration, to_plain

_NAMES = {
    "ConfigError": "ddlaunch.config.errors",
    "ConfigIssue": "ddlaunch.config.errors",
    "Config": "ddlaunch.config.schema",
    "load_config": "ddlaunch.config.validate",
    "parse_duration": "ddlaunch.config.validate",
    "to_plain": "ddlaunch.config.validate",
}

__all__ = ["Config", "ConfigError", "ConfigIssue", "load_config", "parse_duration", "to_plain"]


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
