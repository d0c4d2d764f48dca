"""`source = "cdek"`: CDEK's webhooks, which are not signed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.model import RouteConfig
from relay.config.reader import Section
from relay.kinds.base import SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


@dataclass(frozen=True)
class CdekSource:
    pass


def parse(section: Section) -> CdekSource:
    return CdekSource()


def build(settings: CdekSource) -> Source:
    from relay.sources.profiles import Cdek

    return Cdek(settings)


def advice(settings: CdekSource, route: RouteConfig) -> list[str]:
    if route.allow_ips:
        return []
    return [
        "CDEK does not sign its webhooks: keep a secret in the path and set"
        " allow_ips to CDEK's addresses"
    ]


KIND = SourceKind(name="cdek", parse=parse, build=build, advice=advice)
