"""`source = "cdek"`: CDEK's webhooks, which are not signed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relay.config.model import Answer, RouteConfig
from relay.kinds.base import SourceKind
from relay.kinds.source import Accept, Check, Source
from relay.sources.base import joined_key, json_field

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


def build(settings: None) -> Source:
    return Cdek()


def advice(settings: None, route: RouteConfig) -> list[str]:
    if route.allow_ips:
        return []
    return [
        "CDEK does not sign its webhooks: keep a secret in the path and set"
        " allow_ips to CDEK's addresses"
    ]


class Cdek:
    """CDEK v2 webhooks: unsigned (use a secret path and allow_ips); CDEK never retries."""

    answer: Answer | None = None

    def check(self, incoming: Incoming, now: float) -> Check:
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        data = incoming.json
        # Older payloads carry the status as attributes.status_code instead.
        code = json_field(data, "attributes", "code")
        if code is None or code == "":
            code = json_field(data, "attributes", "status_code")
        changed_at = json_field(data, "attributes", "status_date_time")
        return joined_key(json_field(data, "uuid"), code, changed_at)


KIND = SourceKind(name="cdek", build=build, advice=advice)
