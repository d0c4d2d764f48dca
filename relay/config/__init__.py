"""Configuration: one TOML file read into frozen objects (see `model`)."""

from relay.config.load import load_config, parse_config
from relay.config.model import (
    AdminConfig,
    AlertsConfig,
    Config,
    FileTarget,
    HttpTarget,
    Listen,
    LogConfig,
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
    "Config",
    "ConfigError",
    "FileTarget",
    "HttpTarget",
    "Listen",
    "LogConfig",
    "RetryPolicy",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "StorageConfig",
    "TargetConfig",
    "load_config",
    "parse_config",
]
