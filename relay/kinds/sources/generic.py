"""`source = "generic"` (the default): any sender, an optional shared token."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.model import RouteConfig
from relay.config.reader import Section
from relay.config.sources import secret_list
from relay.kinds.base import SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


@dataclass(frozen=True)
class GenericSource:
    tokens: tuple[str, ...] = ()
    token_header: str = "X-Relay-Token"
    token_query: str = "token"


def parse(section: Section) -> GenericSource:
    return GenericSource(
        tokens=secret_list(section, "token", required=False),
        token_header=section.string("token_header", "X-Relay-Token"),
        token_query=section.string("token_query", "token"),
    )


def build(settings: GenericSource) -> Source:
    from relay.sources.profiles import Generic

    return Generic(settings)


def secrets(settings: GenericSource) -> Iterable[str]:
    return settings.tokens


def advice(settings: GenericSource, route: RouteConfig) -> list[str]:
    if settings.tokens or route.allow_ips:
        return []
    return [
        "anyone can post to it (no token, no signature, no allow_ips);"
        " set a source profile or a token"
    ]


KIND = SourceKind(
    name="generic",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("token",),
    advice=advice,
)
