"""`source = "tilda"`: Tilda's form webhooks, an optional API key."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relay.config.model import Answer, RouteConfig
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SourceKind
from relay.kinds.source import Accept, Check, Ping, Reject, Source
from relay.sources.base import matches_any, text_answer

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


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
    return Tilda(settings)


def secrets(settings: TildaSource) -> Iterable[str]:
    return settings.api_keys


def advice(settings: TildaSource, route: RouteConfig) -> list[str]:
    if settings.api_keys or route.allow_ips:
        return []
    return ["Tilda route without api_key: anyone can post a form to it"]


class Tilda:
    """Tilda forms: urlencoded fields, or a JSON object when the webhook is set to
    send JSON; `test=test` (or {"test": "test"}) when the webhook is connected.

    Tilda waits 5 s for an answer, then retries twice a minute apart with the
    same `tranid`: that is the key.
    """

    answer: Answer | None = text_answer("ok")

    def __init__(self, settings: TildaSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        settings = self.settings
        if settings.api_keys:
            # A key in the header is checked before the body is parsed at all:
            # a forged request then costs no parsing.
            header_key = incoming.headers.get(settings.api_key_header)
            if header_key is not None and not matches_any(header_key, settings.api_keys):
                return Reject("bad_api_key")
        fields = _tilda_fields(incoming)
        if fields.get("test") == "test":
            return Ping(text_answer("ok"))
        if settings.api_keys:
            given = incoming.headers.get(settings.api_key_header) or fields.get(
                settings.api_key_field
            )
            if not given or not isinstance(given, str):
                return Reject("missing_api_key")
            if not matches_any(given, settings.api_keys):
                return Reject("bad_api_key")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        tranid = _tilda_fields(incoming, keyed=True).get("tranid")
        return str(tranid) if tranid not in (None, "") else None


def _tilda_fields(incoming: Incoming, *, keyed: bool = False) -> dict[str, Any]:
    """The lead's fields: the form, or the JSON object Tilda sends instead
    (`keyed`: with bytes that are not UTF-8 kept, for its key)."""
    form = incoming.exact_form if keyed else incoming.form
    if form is not None:
        return dict(form)
    data = incoming.json
    return data if isinstance(data, dict) else {}


KIND = SourceKind(
    name="tilda",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("api_key",),
    secret_headers=(API_KEY_HEADER,),
    advice=advice,
)
