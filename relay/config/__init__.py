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
    Rate,
    RetryPolicy,
    RouteConfig,
    RouteTarget,
    ServerConfig,
    SmtpTarget,
    StorageConfig,
    TargetConfig,
    TelegramTarget,
)
from relay.config.operator import OperatorConfig, load_operator_config
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
    "OperatorConfig",
    "Rate",
    "RetryPolicy",
    "RouteConfig",
    "RouteTarget",
    "ServerConfig",
    "SmtpTarget",
    "StorageConfig",
    "TargetConfig",
    "TelegramTarget",
    "load_config",
    "load_operator_config",
    "parse_config",
]
