"""The `telegram` target: Bot API sendMessage to one chat.

Telegram's rules: a 429 carries its wait in `parameters.retry_after`; 400
(chat not found, can't parse entities), 401, 403 (bot blocked) and 404 are
permanent; 5xx and network errors are retried. Text over 4096 characters is
cut with a visible marker, never refused. The bot token is part of the URL
path, so the URL never appears in an error, a log or the attempt log.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from relay.kinds.targets.telegram import TelegramSettings
from relay.outcome import Outcome
from relay.targets.base import Envelope, context, rendered, variables
from relay.targets.http import USER_AGENT, Request, SessionOwner, exchange, parse_retry_after
from relay.templates import TemplateError, escape_markdown_v2

MAX_TEXT = 4096
CUT_MARKER = "\n… (cut: the message was longer than Telegram allows)"
PERMANENT = {400, 401, 403, 404}
# Tags Telegram's HTML mode knows; a cut inside one must close it again.
_TAG = re.compile(r"<(/?)([a-zA-Z-]+)[^>]*>")


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
        session = self.session
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/sandbox.py).
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
        return await exchange(session, prepared, judge, envelope.paced, body_by=envelope.answer_by)


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
        return Outcome.retry(f"Telegram: {description}", status, excerpt, retry_after)
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
    marker = escape_markdown_v2(CUT_MARKER) if markdown_v2 else CUT_MARKER
    room = limit - len(marker)
    while True:
        head = text[:room]
        if markdown_v2 and (len(head) - len(head.rstrip("\\"))) % 2:
            head = head[:-1]  # half an escape: "\\" without the character it escapes
        if html:
            head = re.sub(r"<[^>]*$", "", head)  # half a tag
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
