"""Configuration: one TOML file read into frozen objects (see `model`; each
kind's own settings live beside it in relay.kinds)."""

from relay.config.load import load_config, parse_config
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
from relay.config.operator import OperatorConfig, load_operator_config
from relay.config.reader import ConfigError

__all__ = [
    "AdminConfig",
    "AlertsConfig",
    "Answer",
    "Config",
    "ConfigError",
    "Listen",
    "LogConfig",
    "OperatorConfig",
    "Rate",
    "RetryPolicy",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "StorageConfig",
    "TargetConfig",
    "load_config",
    "load_operator_config",
    "parse_config",
]
