"""`source = "generic"` (the default): any sender, an optional shared token."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.model import Answer, RouteConfig
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SourceKind
from relay.kinds.source import ACCEPT, Check, Reject, Source
from relay.sources.base import matches_any

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


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


class Generic:
    """Any sender; optionally a shared token in a header or the query string."""

    answer: Answer | None = None

    def __init__(self, settings: GenericSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        if settings.tokens:
            given = incoming.headers.get(settings.token_header)
            if given is None:
                given = incoming.query_fields.get(settings.token_query)
            if given is None:
                return Reject(
                    "missing_token",
                    f"no {settings.token_header} header or ?{settings.token_query}=",
                )
            if not matches_any(given, settings.tokens):
                return Reject("bad_token")
        return ACCEPT

    def key(self, incoming: Incoming) -> str | None:
        return None


KIND = SourceKind(
    name="generic",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("token",),
    advice=advice,
)
