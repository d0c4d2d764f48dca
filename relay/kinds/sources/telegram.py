"""`source = "telegram"`: a bot's updates, with the webhook's secret_token."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.config.reader import Section
from relay.config.sources import secret_list
from relay.kinds.base import SourceKind

if TYPE_CHECKING:
    from relay.sources.base import Source


# The secret_token given to setWebhook comes back in this header
# (https://core.telegram.org/bots/api#setwebhook).
SECRET_TOKEN_HEADER = "X-Telegram-Bot-Api-Secret-Token"


@dataclass(frozen=True)
class TelegramSource:
    secret_tokens: tuple[str, ...]


def parse(section: Section) -> TelegramSource:
    return TelegramSource(secret_tokens=secret_list(section, "secret_token"))


def build(settings: TelegramSource) -> Source:
    from relay.sources.profiles import Telegram

    return Telegram(settings)


def secrets(settings: TelegramSource) -> Iterable[str]:
    return settings.secret_tokens


KIND = SourceKind(
    name="telegram",
    parse=parse,
    build=build,
    secrets=secrets,
    secret_keys=("secret_token",),
    secret_headers=(SECRET_TOKEN_HEADER,),
)
