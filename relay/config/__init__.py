"""Configuration: one TOML file read into frozen objects (see `model`).

Layered so that no import runs in a circle: `reader` (TOML primitives:
Section, ConfigError), `files` and `model` sit below the kinds (each target
type's and source's module reads its own keys with them); `load` and
`operator`, which know the kinds (relay.kinds), sit above, and are imported
from here only when first asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from relay.config.load import load_config, parse_config
    from relay.config.operator import OperatorConfig, load_operator_config

# The kind-aware readers, by name: imported on first use (PEP 562).
_ABOVE_THE_KINDS = {
    "load_config": "relay.config.load",
    "parse_config": "relay.config.load",
    "OperatorConfig": "relay.config.operator",
    "load_operator_config": "relay.config.operator",
}


def __getattr__(name: str) -> Any:
    module = _ABOVE_THE_KINDS.get(name)
    if module is None:
        raise AttributeError(f"module 'relay.config' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


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
