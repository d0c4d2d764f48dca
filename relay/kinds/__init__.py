"""The kinds of target and source relay knows: each is one module, registered here.

A kind is one module. A target type is `relay/targets/<type>.py`: its
settings and how they are read, the target that sends (its client imported
when it starts, not when a config is read), and its `KIND` (a `TargetKind`:
how it is built and shown, which settings are credentials), added to
`TARGET_KINDS`. A source is `relay/sources/<name>.py`: its settings, the
profile that checks and names its requests, and its `KIND` (a `SourceKind`:
its credentials, its sender's own retry window), added to `SOURCE_KINDS`.
Nothing else in relay names a kind. `register_target` and `register_source`
add one at run time (tests do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relay.kinds.base import AlertTemplates, SenderRetry, SourceKind, TargetKind
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


# Every header a known sender puts a credential in (lower case): relay.secrets
# masks them and the search index leaves them out. Worked out when a source
# registers, not when asked: it is asked for each header of each request shown
# or indexed.
SECRET_HEADERS = _secret_headers()


def _sources_changed() -> None:
    global SECRET_HEADERS
    SECRET_HEADERS = _secret_headers()


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


__all__ = [
    "SECRET_HEADERS",
    "SOURCE_KINDS",
    "TARGET_KINDS",
    "AlertTemplates",
    "SenderRetry",
    "SourceKind",
    "TargetKind",
    "build_source",
    "build_target",
    "register_source",
    "register_target",
    "source_kind",
    "target_kind",
    "unregister_source",
    "unregister_target",
]
