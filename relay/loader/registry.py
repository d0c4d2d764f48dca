"""The registry of kinds: every target type and source relay knows, by name.

Relay's own kinds are registered here by module name, as plugins would be
(datasette's DEFAULT_PLUGINS): each module's `KIND` is read the first time
any kind is looked up, so `relay --version`, the completion script and the
importing of this module load no sender's or target's code. Adding a kind is
its module and one line below; `register_target` and `register_source` add
one at run time (tests do).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from relay.core.secrets import declare_secret_headers
from relay.kinds.base import SourceKind, TargetKind
from relay.targets.alerting import AlertAware, alert_settings

if TYPE_CHECKING:
    from relay.config.model import RouteConfig, TargetConfig
    from relay.kinds.source import Source
    from relay.kinds.target import Target

BUILT_IN_TARGETS = (
    "relay.targets.http",
    "relay.targets.file",
    "relay.targets.smtp",
    "relay.targets.telegram",
)
# In the order `relay check` and the docs list them; "generic" is the default.
BUILT_IN_SOURCES = (
    "relay.sources.generic",
    "relay.sources.tilda",
    "relay.sources.tbank",
    "relay.sources.woocommerce",
    "relay.sources.telegram",
    "relay.sources.cdek",
    "relay.sources.standard_webhooks",
    "relay.sources.hmac",
)

_TARGETS: dict[str, TargetKind[Any]] = {}
_SOURCES: dict[str, SourceKind[Any]] = {}
_loaded = False


def _load_built_ins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILT_IN_TARGETS:
        register_target(importlib.import_module(module).KIND)
    for module in BUILT_IN_SOURCES:
        register_source(importlib.import_module(module).KIND)


def target_kinds() -> Mapping[str, TargetKind[Any]]:
    _load_built_ins()
    return _TARGETS


def source_kinds() -> Mapping[str, SourceKind[Any]]:
    _load_built_ins()
    return _SOURCES


def target_kind(name: str) -> TargetKind[Any]:
    return target_kinds()[name]


def source_kind(name: str) -> SourceKind[Any]:
    return source_kinds()[name]


def register_target(kind: TargetKind[Any]) -> None:
    _load_built_ins()
    if kind.name in _TARGETS:
        raise ValueError(f"a target type {kind.name!r} is already registered")
    _TARGETS[kind.name] = kind


def unregister_target(name: str) -> None:
    del _TARGETS[name]


def register_source(kind: SourceKind[Any]) -> None:
    _load_built_ins()
    if kind.name in _SOURCES:
        raise ValueError(f"a source {kind.name!r} is already registered")
    _SOURCES[kind.name] = kind
    _sources_changed()


def unregister_source(name: str) -> None:
    del _SOURCES[name]
    _sources_changed()


def _sources_changed() -> None:
    """Every header a known sender puts a credential in (lower case), told to
    relay.core.secrets, which sits below the kinds: it masks them, and the
    search index leaves them out. Worked out when a source registers, not
    when asked: it is asked for each header of each request shown or indexed."""
    declare_secret_headers(
        frozenset(header.lower() for kind in _SOURCES.values() for header in kind.secret_headers)
    )


def build_target(config: TargetConfig) -> Target:
    """The target, sending alert deliveries with the alert's own subject and
    text when its kind declares how (relay.targets.alerting)."""
    kind = target_kind(config.type)
    target = kind.build(config.name, config.settings, config.concurrency)
    twin = alert_settings(config, kind)
    if twin is None:
        return target
    return AlertAware(target, kind.build(twin.name, twin.settings, twin.concurrency))


def build_source(route: RouteConfig) -> Source:
    """The profile of the route's source kind."""
    return source_kind(route.source_kind).build(route.source)
