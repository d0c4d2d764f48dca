"""The `telegram` target: Bot API sendMessage to one chat.

Telegram's rules: a 429 carries its wait in `parameters.retry_after`; 400
(chat not found, can't parse entities), 401, 403 (bot blocked) and 404 are
permanent; 5xx and network errors are retried. Text over 4096 characters is
cut with a visible marker, never refused. The bot token is part of the URL
path, so the URL never appears in an error, a log or the attempt log.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from multidict import CIMultiDictProxy

from relay.config.model import Rate
from relay.config.reader import ConfigError, Section
from relay.core.budget import TemplateError
from relay.core.outcome import Outcome
from relay.core.payload import EVENT_VARIABLES
from relay.kinds.base import AlertTemplates, TargetKind
from relay.kinds.target import Envelope, Target
from relay.targets.base import context, rendered, variables
from relay.targets.outbound.connections import Outbound, SessionOwner, parse_outbound, parse_url
from relay.targets.outbound.policy import USER_AGENT, exchange, parse_retry_after
from relay.targets.outbound.transport import Request

if TYPE_CHECKING:
    from relay.core.secrets import Masker
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
    chat_id = settings.chat_id
    chat_rate = TELEGRAM_CHAT_RATE if is_private(chat_id) else TELEGRAM_GROUP_RATE
    return ((_bot_pace(settings), TELEGRAM_BOT_RATE), (_chat_pace(settings), chat_rate))


def held_by_a_wait(settings: TelegramSettings) -> frozenset[str]:
    """A flood wait (a 429 with retry_after) holds the chat it answered, not
    the bot's other chats. Telegram does not name the limit a wait is for,
    but its documented ones do: relay sends a bot's messages within its 30/s
    and each chat's within its own (1/s, 20/min for a group), so the limit
    met is the one Telegram enforces less evenly, a chat's (real group waits
    run 30-40 s), and a private chat must not wait a group's. Were it ever
    the bot's, each chat would meet it and hold itself."""
    return frozenset({_chat_pace(settings)})


def _bot_pace(settings: TelegramSettings) -> str:
    return "telegram-bot-" + hashlib.sha256(settings.bot_token.encode()).hexdigest()[:12]


def _chat_pace(settings: TelegramSettings) -> str:
    """One chat's pace, however it is written: a @username is case-
    insensitive (Telegram: "Usernames are case-insensitive"), so
    @Shop_Leads_Chat and @shop_leads_chat are one chat."""
    chat_id = settings.chat_id
    if chat_id.startswith("@"):
        chat_id = chat_id.lower()
    return f"telegram-chat-{_bot_pace(settings).removeprefix('telegram-bot-')}-{chat_id}"


def build(name: str, settings: TelegramSettings, concurrency: int) -> Target:
    return TelegramTarget(name, settings, concurrency=concurrency)


def destination(settings: TelegramSettings, masker: Masker) -> str:
    return f"chat {settings.chat_id}, {settings.parse_mode}"


def view(settings: TelegramSettings, masker: Masker) -> dict[str, Any]:
    return {"chat_id": settings.chat_id}


def secrets(settings: TelegramSettings) -> Iterable[str]:
    return [settings.bot_token, *settings.outbound.secrets()]


def alert_settings(settings: TelegramSettings, alert: AlertTemplates) -> TelegramSettings:
    """The alert's text, as plain text: no parse mode for it to trip on."""
    return replace(settings, text=alert.text, parse_mode="none")


MAX_TEXT = 4096
CUT_MARKER = "\n… (cut: the message was longer than Telegram allows)"
PERMANENT = {400, 401, 403, 404}
# Tags Telegram's HTML mode knows; a cut inside one must close it again.
# A tag ends before the next "<": each scan stops there, so a text of
# unclosed "<a<a<a…" costs one pass, not one pass per "<".
_TAG = re.compile(r"<(/?)([a-zA-Z-]++)[^<>]*+>")


class TelegramTarget(SessionOwner):
    def __init__(self, name: str, settings: TelegramSettings, *, concurrency: int) -> None:
        super().__init__(concurrency, settings.outbound)
        self.name = name
        self._settings = settings
        self._wanted = variables([settings.text])

    def payload(self, envelope: Envelope) -> dict[str, Any]:
        settings = self._settings
        text = settings.text.render(context(envelope, self._wanted))
        if not text.strip():
            raise TemplateError("text template rendered an empty message")
        payload: dict[str, Any] = {
            "chat_id": settings.chat_id,
            "text": cut(
                text,
                html=settings.parse_mode == "HTML",
                markdown_v2=settings.parse_mode == "MarkdownV2",
            ),
        }
        if settings.parse_mode != "none":
            payload["parse_mode"] = settings.parse_mode
        if settings.disable_notification:
            payload["disable_notification"] = True
        return payload

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        url = f"{self._settings.api_base}/bot***/sendMessage"
        if not wire:
            # The message as the chat shows its text (markup still in it).
            payload = self.payload(envelope)
            options = ", ".join(
                f"{key} {value}" for key, value in payload.items() if key not in ("chat_id", "text")
            )
            return (
                f"POST {url}: to chat {payload['chat_id']}"
                + (f" ({options})" if options else "")
                + "\n\n"
                + str(payload["text"])
            )
        return (
            f"POST {url}\n\n"
            + orjson.dumps(self.payload(envelope), option=orjson.OPT_INDENT_2).decode()
        )

    async def send(self, envelope: Envelope) -> Outcome:
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/templates/sandbox.py).
            payload = await rendered(self.payload, envelope, self._wanted)
        except TemplateError as error:
            return Outcome.unsendable(str(error))
        settings = self._settings
        prepared = Request(
            "POST",
            f"{settings.api_base}/bot{settings.bot_token}/sendMessage",
            {"Content-Type": "application/json", "User-Agent": USER_AGENT},
            orjson.dumps(payload),
        )
        outcome = await exchange(
            self.transport, prepared, judge, envelope.paced, body_by=envelope.answer_by
        )
        # The message as sent (its text rendered), kept with the attempt.
        return replace(outcome, request=prepared.sent())


def judge(status: int, headers: CIMultiDictProxy[str], excerpt: bytes) -> Outcome:
    try:
        answer = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        answer = None  # a long success answer is cut at 2 KiB; the status says enough
    answer = answer if isinstance(answer, dict) else {}
    description = str(answer.get("description") or f"HTTP {status}")
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    if status == 429:
        parameters = answer.get("parameters")
        wait = parameters.get("retry_after") if isinstance(parameters, dict) else None
        retry_after = (
            float(wait)
            if isinstance(wait, int | float)
            else parse_retry_after(headers.get("Retry-After"))
        )
        # A flood wait: a throttle, holding this chat (held_by_a_wait).
        return Outcome.retry(
            f"Telegram: {description}", status, excerpt, retry_after, throttle=True
        )
    if status >= 500:
        return Outcome.retry(f"Telegram: {description}", status, excerpt)
    parameters = answer.get("parameters")
    moved_to = parameters.get("migrate_to_chat_id") if isinstance(parameters, dict) else None
    if status == 400 and moved_to is not None:
        # The group became a supergroup with a new id: nothing to retry until
        # the config says where the chat is now.
        return Outcome.fail(
            f"Telegram: chat moved to {moved_to}: update chat_id to {moved_to},"
            " reload, then requeue the dead deliveries",
            status,
            excerpt,
        )
    if status in PERMANENT:
        return Outcome.fail(f"Telegram: {description}", status, excerpt)
    return Outcome.fail(f"Telegram: unexpected HTTP {status}: {description}", status, excerpt)


def cut(text: str, *, html: bool, markdown_v2: bool = False, limit: int = MAX_TEXT) -> str:
    """Text that fits Telegram's limit; a cut one ends with a visible marker.

    In HTML mode the cut never leaves half a tag or entity, and tags left open
    are closed, so the shortened message still parses. In MarkdownV2 mode the
    marker is escaped as the mode wants and the cut never splits an escape.
    """
    if len(text) <= limit:
        return text
    if markdown_v2:
        from relay.templates import escape_markdown_v2  # a MarkdownV2 text is a template's

        marker = escape_markdown_v2(CUT_MARKER)
    else:
        marker = CUT_MARKER
    room = limit - len(marker)
    while True:
        head = text[:room]
        if markdown_v2 and (len(head) - len(head.rstrip("\\"))) % 2:
            head = head[:-1]  # half an escape: "\\" without the character it escapes
        if html:
            half_tag = head.find("<", head.rfind(">") + 1)
            if half_tag >= 0:
                head = head[:half_tag]
            head = re.sub(r"&[a-zA-Z0-9#]*$", "", head)  # half an entity
            open_tags: list[str] = []
            for closing, name in _TAG.findall(head):
                if closing:
                    if name in open_tags:
                        open_tags.remove(name)
                else:
                    open_tags.append(name)
            head += "".join(f"</{name}>" for name in reversed(open_tags))
        result = head + marker
        if len(result) <= limit:
            return result
        room -= len(result) - limit


KIND = TargetKind(
    name="telegram",
    parse=parse,
    build=build,
    destination=destination,
    view=view,
    secrets=secrets,
    secret_keys=("bot_token",),
    # One message at a time: a chat's messages arrive in the order relay sends them.
    default_concurrency=1,
    shared_rates=shared_rates,
    held_by_a_wait=held_by_a_wait,
    alert_settings=alert_settings,
)
