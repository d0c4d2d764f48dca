"""Configuration: one TOML file read into frozen objects (see `model`)."""

from relay.config.load import load_config, parse_config
from relay.config.model import (
    Config,
    FileTarget,
    HttpTarget,
    Listen,
    RetryPolicy,
    RouteConfig,
    RouteTarget,
    ServerConfig,
    StorageConfig,
    TargetConfig,
)
from relay.config.reader import ConfigError

__all__ = [
    "Config",
    "ConfigError",
    "FileTarget",
    "HttpTarget",
    "Listen",
    "RetryPolicy",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "StorageConfig",
    "TargetConfig",
    "load_config",
    "parse_config",
]
