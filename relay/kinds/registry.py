"""The registry of kinds: every target type and source relay knows, by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relay.core.secrets import declare_secret_headers
from relay.kinds.base import SourceKind, TargetKind
from relay.sources import (
    cdek,
    generic,
    hmac,
    standard_webhooks,
    tbank,
    tilda,
    woocommerce,
)
from relay.sources import telegram as telegram_source
from relay.targets import file, http, smtp, telegram
from relay.targets.alerting import AlertAware, alert_settings

if TYPE_CHECKING:
    from relay.config.model import RouteConfig, TargetConfig
    from relay.sources.base import Source
    from relay.targets.base import Target

TARGET_KINDS: dict[str, TargetKind[Any]] = {
    kind.name: kind for kind in (http.KIND, file.KIND, smtp.KIND, telegram.KIND)
}

# In the order `relay check` and the docs list them; "generic" is the default.
SOURCE_KINDS: dict[str, SourceKind[Any]] = {
    kind.name: kind
    for kind in (
        generic.KIND,
        tilda.KIND,
        tbank.KIND,
        woocommerce.KIND,
        telegram_source.KIND,
        cdek.KIND,
        standard_webhooks.KIND,
        hmac.KIND,
    )
}


def register_target(kind: TargetKind[Any]) -> None:
    if kind.name in TARGET_KINDS:
        raise ValueError(f"a target type {kind.name!r} is already registered")
    TARGET_KINDS[kind.name] = kind


def unregister_target(name: str) -> None:
    del TARGET_KINDS[name]


def target_kind(name: str) -> TargetKind[Any]:
    return TARGET_KINDS[name]


def register_source(kind: SourceKind[Any]) -> None:
    if kind.name in SOURCE_KINDS:
        raise ValueError(f"a source {kind.name!r} is already registered")
    SOURCE_KINDS[kind.name] = kind
    _sources_changed()


def unregister_source(name: str) -> None:
    del SOURCE_KINDS[name]
    _sources_changed()


def _secret_headers() -> frozenset[str]:
    return frozenset(
        header.lower() for kind in SOURCE_KINDS.values() for header in kind.secret_headers
    )


# Every header a known sender puts a credential in (lower case): relay.core.secrets
# masks them and the search index leaves them out. Worked out when a source
# registers, not when asked: it is asked for each header of each request shown
# or indexed. Told to relay.core.secrets, which sits below the kinds.
SECRET_HEADERS = _secret_headers()
declare_secret_headers(SECRET_HEADERS)


def _sources_changed() -> None:
    global SECRET_HEADERS
    SECRET_HEADERS = _secret_headers()
    declare_secret_headers(SECRET_HEADERS)


def source_kind(name: str) -> SourceKind[Any]:
    return SOURCE_KINDS[name]


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
