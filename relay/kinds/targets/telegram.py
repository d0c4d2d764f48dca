"""`type = "telegram"`: a message to a chat through the Bot API, paced by its limits."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from relay.config.model import Rate
from relay.config.reader import ConfigError, Section
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.targets.http import Outbound, parse_outbound, parse_url
from relay.payload import EVENT_VARIABLES

if TYPE_CHECKING:
    from relay.secrets import Masker
    from relay.targets.base import Target
    from relay.templates import Template


TelegramParseMode = Literal["HTML", "MarkdownV2", "none"]


@dataclass(frozen=True)
class TelegramSettings:
    bot_token: str
    chat_id: str
    text: Template
    parse_mode: TelegramParseMode = "HTML"
    disable_notification: bool = False
    api_base: str = "https://api.telegram.org"
    outbound: Outbound = field(default_factory=Outbound)  # proxy and TLS, as http's


# Telegram's limits (Bot API FAQ, "My bot is hitting limits"): about one
# message a second to one chat, 30 a second per bot, 20 a minute to a group.
# Sending within them needs no setting.
TELEGRAM_CHAT_RATE = Rate(1, 1.0)
TELEGRAM_GROUP_RATE = Rate(20, 60.0)
TELEGRAM_BOT_RATE = Rate(30, 1.0)

PARSE_MODES: tuple[TelegramParseMode, ...] = ("HTML", "MarkdownV2", "none")

# What a Telegram text becomes when none is set: an alert's text, else the body.
DEFAULT_TELEGRAM_TEXT = "{{ json.text | default(body) }}"


def parse(section: Section, base: Path) -> TelegramSettings:
    token = section.string("bot_token")
    if not re.fullmatch(r"\d+:[A-Za-z0-9_-]+", token):
        # Never echo the value: it is a credential.
        raise ConfigError(section.key("bot_token"), 'expected a bot token like "123456:ABC-..."')
    chat = section.take("chat_id")
    if isinstance(chat, bool) or not isinstance(chat, int | str) or not str(chat).strip():
        raise section.error("chat_id", 'a chat id like -1001234567890 or "@channel"', chat)
    parse_mode: TelegramParseMode = section.choice("parse_mode", PARSE_MODES, "HTML")
    text = section.template_or(
        "text",
        DEFAULT_TELEGRAM_TEXT,
        offers=EVENT_VARIABLES,
        html=parse_mode == "HTML",
        markdown_v2=parse_mode == "MarkdownV2",
    )
    return TelegramSettings(
        bot_token=token,
        chat_id=str(chat).strip(),
        text=text,
        parse_mode=parse_mode,
        disable_notification=section.boolean("disable_notification", False),
        api_base=parse_url(section, "api_base", "https://api.telegram.org").rstrip("/"),
        outbound=parse_outbound(section, base),
    )


def is_private(chat_id: str) -> bool:
    """A person's chat: a positive id. Groups and supergroups have negative
    ids, and a `@username` names a channel or a public supergroup (sendMessage:
    "username of the target channel"; the Bot API cannot address a person by
    username), so everything else is paced as a group."""
    return chat_id.isdigit()


def shared_rates(settings: TelegramSettings) -> tuple[tuple[str, Rate], ...]:
    """Paced per bot and per chat, whichever targets send there: two targets on
    one chat share its 1/s (20/min for a group, a channel, a @username)."""
    bot = hashlib.sha256(settings.bot_token.encode()).hexdigest()[:12]
    chat_id = settings.chat_id
    chat_rate = TELEGRAM_CHAT_RATE if is_private(chat_id) else TELEGRAM_GROUP_RATE
    return (
        (f"telegram-bot-{bot}", TELEGRAM_BOT_RATE),
        (f"telegram-chat-{bot}-{chat_id}", chat_rate),
    )


def build(name: str, settings: TelegramSettings, concurrency: int) -> Target:
    from relay.targets.telegram import TelegramTarget  # the HTTP client: only to send

    return TelegramTarget(name, settings, concurrency=concurrency)


def describe(settings: TelegramSettings, masker: Masker) -> str:
    return f"chat {settings.chat_id}, {settings.parse_mode}"


def view(settings: TelegramSettings, masker: Masker) -> dict[str, Any]:
    return {"chat_id": settings.chat_id}


def secrets(settings: TelegramSettings) -> Iterable[str]:
    return [settings.bot_token, *settings.outbound.secrets()]


def alert_settings(settings: TelegramSettings, alert: AlertTemplates) -> TelegramSettings:
    """The alert's text, as plain text: no parse mode for it to trip on."""
    return replace(settings, text=alert.text, parse_mode="none")


KIND = TargetKind(
    name="telegram",
    parse=parse,
    build=build,
    describe=describe,
    view=view,
    secrets=secrets,
    secret_keys=("bot_token",),
    # One message at a time: a chat's messages arrive in the order relay sends them.
    default_concurrency=1,
    shared_rates=shared_rates,
    alert_settings=alert_settings,
)
