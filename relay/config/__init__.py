"""Configuration's primitives: the frozen objects a config is read into
(`model`), reading a TOML section (`reader`), files and retry policies, and
what kinds' settings share (`shared`). Imported by everything, knowing no
kind: each target type's and source's module reads its own keys with them.
Reading a whole file, which knows every kind, is relay.loader.
"""

from __future__ import annotations

from relay.config.model import (
    AdminConfig,
    AlertsConfig,
    Answer,
    Config,
    Listen,
    LogConfig,
    Rate,
    RetryPolicy,
    RouteConfig,
    RouteTarget,
    ServerConfig,
    StorageConfig,
    TargetConfig,
)
from relay.config.reader import ConfigError

__all__ = [
    "AdminConfig",
    "AlertsConfig",
    "Answer",
    "Config",
    "ConfigError",
    "Listen",
    "LogConfig",
    "Rate",
    "RetryPolicy",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "StorageConfig",
    "TargetConfig",
]
