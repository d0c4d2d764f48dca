"""`[targets.NAME]` tables: the keys common to every target, then each type's own."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from types import MappingProxyType

import yarl

from relay.config.files import ca_file_problem, folder_problem
from relay.config.model import (
    FileTarget,
    HttpTarget,
    Rate,
    RetryPolicy,
    SmtpTarget,
    TargetConfig,
    TargetSettings,
    TelegramTarget,
)
from relay.config.policy import parse_retry
from relay.config.reader import ConfigError, Section
from relay.config.sources import secret_list, whsec
from relay.payload import EVENT_VARIABLES

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*")
HTTP_METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET")
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*")
_RATE_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
}
_EMAIL = re.compile(r"[^@\s<>]+@[^@\s<>]+|.*<[^@\s<>]+@[^@\s<>]+>")

# Telegram's own limits: about one message a second to a chat, thirty a
# second per bot. Sending within them needs no setting.
# Telegram's limits (Bot API FAQ, "My bot is hitting limits"): about one
# message a second to one chat, 30 a second per bot, 20 a minute to a group.
TELEGRAM_CHAT_RATE = Rate(1, 1.0)
TELEGRAM_GROUP_RATE = Rate(20, 60.0)
TELEGRAM_BOT_RATE = Rate(30, 1.0)

# What a Telegram text becomes when none is set: an alert's text, else the body.
DEFAULT_TELEGRAM_TEXT = "{{ json.text | default(body) }}"
DEFAULT_MAIL_SUBJECT = "{{ json.summary | default('relay: event ' ~ event.id) }}"
DEFAULT_MAIL_TEXT = "{{ json.text | default(body) }}"


def parse_target(
    name: str, section: Section, default_retry: RetryPolicy, base: Path
) -> TargetConfig:
    if not NAME.fullmatch(name):
        raise ConfigError(section.where, "expected a name of letters, digits, _ and -")
    kind = section.choice("type", ("http", "file", "smtp", "telegram"))
    retry = parse_retry(section.section("retry"), default_retry)
    settings: TargetSettings
    shared_rates: tuple[tuple[str, Rate], ...] = ()
    if kind == "http":
        settings = _http(section)
    elif kind == "file":
        settings = FileTarget(path=section.path("path", base))
        if problem := folder_problem(settings.path):
            raise ConfigError(section.key("path"), problem)
    elif kind == "smtp":
        settings = _smtp(section, base)
    else:
        settings = _telegram(section)
        shared_rates = telegram_rates(settings.bot_token, settings.chat_id)
    default_concurrency = 1 if kind == "telegram" else 4
    concurrency = section.integer("concurrency", default_concurrency, minimum=1, maximum=1000)
    rate = _rate(section, "rate")
    rate_group = section.string("rate_group", None)
    if rate_group is not None:
        if rate is None:
            raise ConfigError(section.key("rate_group"), "needs a rate, shared by the group")
        # One pacer for every target of the group (two Bitrix24 targets on one
        # portal: its limit is the portal's, not each target's).
        shared_rates += ((f"group-{rate_group}", rate),)
        rate = None
    hold_when_down = section.boolean("hold_when_down", False)
    down_after = section.integer("down_after", None, minimum=1, maximum=1000)
    if down_after is not None and not hold_when_down:
        raise ConfigError(section.key("down_after"), "is used only with hold_when_down = true")
    section.done()
    return TargetConfig(
        name=name,
        retry=retry,
        settings=settings,
        concurrency=concurrency,
        rate=rate,
        shared_rates=shared_rates,
        hold_when_down=hold_when_down,
        down_after=down_after if down_after is not None else TargetConfig.down_after,
    )


def telegram_rates(bot_token: str, chat_id: str) -> tuple[tuple[str, Rate], ...]:
    """Paced per bot and per chat, whichever targets send there: two targets on
    one chat share its 1/s (20/min for a group: a negative chat_id)."""
    bot = hashlib.sha256(bot_token.encode()).hexdigest()[:12]
    chat_rate = TELEGRAM_GROUP_RATE if chat_id.startswith("-") else TELEGRAM_CHAT_RATE
    return (
        (f"telegram-bot-{bot}", TELEGRAM_BOT_RATE),
        (f"telegram-chat-{bot}-{chat_id}", chat_rate),
    )


def _rate(section: Section, name: str) -> Rate | None:
    value = section.string(name, None)
    if value is None:
        return None
    match = _RATE.fullmatch(value)
    if match is None or int(match.group(1)) == 0:
        raise section.error(name, 'a rate like "2/s", "120/m" or "5000/h"', value)
    return Rate(int(match.group(1)), _RATE_UNITS[match.group(2)])


def _url(section: Section, name: str, default: object = None) -> str:
    url: str = section.string(name) if default is None else section.string(name, default)
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise section.error(name, "an http:// or https:// URL", url)
    return url


def _http(section: Section) -> HttpTarget:
    url = _url(section, "url")
    method = section.string("method", "POST").upper()
    if method not in HTTP_METHODS:
        raise section.error("method", "one of " + ", ".join(HTTP_METHODS), method)
    headers = section.template_map("headers", offers=EVENT_VARIABLES)
    body_format = section.choice("format", ("raw", "json", "form"), "raw")
    body = section.template("body", None, offers=EVENT_VARIABLES)
    form = section.template_map("form", offers=EVENT_VARIABLES)
    if body_format == "json" and body is None:
        raise ConfigError(section.key("body"), 'is required with format = "json"')
    if body_format == "form" and not form:
        raise ConfigError(section.key("form"), 'is required with format = "form"')
    if body_format != "json" and body is not None:
        raise ConfigError(section.key("body"), 'is used only with format = "json"')
    if body_format != "form" and form:
        raise ConfigError(section.key("form"), 'is used only with format = "form"')
    sign = tuple(
        whsec(section, "sign", value) for value in secret_list(section, "sign", required=False)
    )
    return HttpTarget(
        url=url,
        method=method,
        headers=MappingProxyType(headers),
        format=body_format,
        body=body,
        form=MappingProxyType(form),
        sign=sign,
    )


def _addresses(section: Section, name: str, *, required: bool) -> tuple[str, ...]:
    value = section.take(name) if required else section.take(name, None)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise section.error(name, "a list of mail addresses", value)
    for item in items:
        if not _EMAIL.fullmatch(item.strip()):
            raise section.error(name, 'mail addresses like "sales@example.com"', item)
    return tuple(item.strip() for item in items)


def _smtp(section: Section, base: Path) -> SmtpTarget:
    host = section.string("host")
    tls = section.choice("tls", ("implicit", "starttls", "none"), "starttls")
    default_port = {"implicit": 465, "starttls": 587, "none": 25}[tls]
    port = section.integer("port", default_port, minimum=1, maximum=65535)
    username = section.string("username", None)
    password = section.string("password", None, nonempty=False)
    if (username is None) != (password is None):
        missing = "password" if password is None else "username"
        raise ConfigError(
            section.key(missing),
            "is required with " + ("username" if missing == "password" else "password"),
        )
    sender = section.string("from")
    if not _EMAIL.fullmatch(sender):
        raise section.error("from", 'a mail address like "relay@example.com"', sender)
    ca_file = section.path("ca_file", base, None)
    if ca_file is not None and (problem := ca_file_problem(ca_file)):
        raise ConfigError(section.key("ca_file"), problem)
    return SmtpTarget(
        host=host,
        port=port,
        tls=tls,
        sender=sender,
        to=_addresses(section, "to", required=True),
        cc=_addresses(section, "cc", required=False),
        reply_to=section.template("reply_to", None, offers=EVENT_VARIABLES),
        subject=section.template(
            "subject", DEFAULT_MAIL_SUBJECT, offers=EVENT_VARIABLES, compile_default=True
        ),
        text=section.template(
            "text", DEFAULT_MAIL_TEXT, offers=EVENT_VARIABLES, compile_default=True
        ),
        html=section.template("html", None, offers=EVENT_VARIABLES, html=True),
        username=username,
        password=password,
        tls_verify=section.boolean("tls_verify", True),
        ca_file=ca_file,
    )


def _telegram(section: Section) -> TelegramTarget:
    token = section.string("bot_token")
    if not re.fullmatch(r"\d+:[A-Za-z0-9_-]+", token):
        # Never echo the value: it is a credential.
        raise ConfigError(section.key("bot_token"), 'expected a bot token like "123456:ABC-..."')
    chat = section.take("chat_id")
    if isinstance(chat, bool) or not isinstance(chat, int | str) or not str(chat).strip():
        raise section.error("chat_id", 'a chat id like -1001234567890 or "@channel"', chat)
    parse_mode = section.choice("parse_mode", ("HTML", "MarkdownV2", "none"), "HTML")
    text = section.template(
        "text",
        DEFAULT_TELEGRAM_TEXT,
        offers=EVENT_VARIABLES,
        html=parse_mode == "HTML",
        markdown_v2=parse_mode == "MarkdownV2",
        compile_default=True,
    )
    return TelegramTarget(
        bot_token=token,
        chat_id=str(chat).strip(),
        text=text,
        parse_mode=parse_mode,
        disable_notification=section.boolean("disable_notification", False),
        api_base=_url(section, "api_base", "https://api.telegram.org").rstrip("/"),
    )
