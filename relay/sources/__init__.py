"""Source profiles: verify a sender, name its event, answer it the way it expects.

Each source is a kind (relay.kinds.sources), which builds its profile."""

from __future__ import annotations

from relay.config import RouteConfig
from relay.kinds import source_kind
from relay.sources.base import Accept, Check, Ping, Reject, Source


def build_source(route: RouteConfig) -> Source:
    """The profile of the route's source kind (relay.kinds.sources)."""
    return source_kind(route.source_kind).build(route.source)


__all__ = ["Accept", "Check", "Ping", "Reject", "Source", "build_source"]
