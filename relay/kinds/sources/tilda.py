"""`source = "tilda"`: Tilda's form webhooks, an optional API key."""

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


# The header Tilda's form webhook may carry its API key in (the route can name another).
API_KEY_HEADER = "X-Tilda-Api-Key"


@dataclass(frozen=True)
class TildaSource:
    api_keys: tuple[str, ...] = ()
    api_key_header: str = API_KEY_HEADER
    api_key_field: str = "api_key"


def parse(section: Section) -> TildaSource:
    return TildaSource(
        api_keys=secret_list(section, "api_key", required=False),
        api_key_header=section.string("api_key_header", API_KEY_HEADER),
        api_key_field=section.string("api_key_field", "api_key"),
    )


def build(settings: TildaSource) -> Source:
    from relay.sources.profiles import Tilda

    return Tilda(settings)


def secrets(settings: TildaSource) -> Iterable[str]:
    return settings.api_keys


def advice(settings: TildaSource, route: RouteConfig) -> list[str]:
    if settings.api_keys or route.allow_ips:
        return []
    return ["Tilda route without api_key: anyone can post a form to it"]


KIND = SourceKind(
    name="tilda",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("api_key",),
    secret_headers=(API_KEY_HEADER,),
    advice=advice,
)
