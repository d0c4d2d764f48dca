"""`source = "telegram"`: a bot's updates, with the webhook's secret_token."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.model import Answer
from relay.config.reader import Section
from relay.config.shared import secret_list
from relay.kinds.base import SourceKind
from relay.kinds.source import Accept, Check, Reject, Source
from relay.sources.base import json_field, matches_any, text_answer

if TYPE_CHECKING:
    from relay.core.incoming import Incoming


# The secret_token given to setWebhook comes back in this header
# (https://core.telegram.org/bots/api#setwebhook).
SECRET_TOKEN_HEADER = "X-Telegram-Bot-Api-Secret-Token"


@dataclass(frozen=True)
class TelegramSource:
    secret_tokens: tuple[str, ...]


def parse(section: Section) -> TelegramSource:
    return TelegramSource(secret_tokens=secret_list(section, "secret_token"))


def build(settings: TelegramSource) -> Source:
    return Telegram(settings)


def secrets(settings: TelegramSource) -> Iterable[str]:
    return settings.secret_tokens


class Telegram:
    """Telegram bot updates: the secret token set with setWebhook, in a header."""

    answer: Answer | None = text_answer("")  # a JSON body could be read as a Bot API call

    def __init__(self, settings: TelegramSource) -> None:
        self.settings = settings

    def check(self, incoming: Incoming, now: float) -> Check:
        given = incoming.headers.get(SECRET_TOKEN_HEADER)
        if given is None:
            return Reject("missing_token", f"no {SECRET_TOKEN_HEADER} header")
        if not matches_any(given, self.settings.secret_tokens):
            return Reject("bad_token")
        return Accept(self.key(incoming))

    def key(self, incoming: Incoming) -> str | None:
        update_id = json_field(incoming.json, "update_id")
        return str(update_id) if update_id is not None else None


KIND = SourceKind(
    name="telegram",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("secret_token",),
    secret_headers=(SECRET_TOKEN_HEADER,),
)
