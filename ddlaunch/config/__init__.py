"""Config model: schema, loading with presets and overrides, validation with precise errors."""

from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import load_config, parse_duration, to_plain

__all__ = ["Config", "ConfigError", "ConfigIssue", "load_config", "parse_duration", "to_plain"]
