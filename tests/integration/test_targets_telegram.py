"""The telegram target against a local stand-in for the Bot API."""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import EventQuery, Selection, Status
from relay.targets.telegram import CUT_MARKER, MAX_TEXT, cut
from relay.templates import escape_markdown_v2

from conftest import ConfigFactory, RelayFactory

TOKEN = "123456:AAH-secret-bot-token"


class BotApi:
    """Answers sendMessage from a script of (status, body) pairs; the last repeats."""

    def __init__(self, clock: FakeClock, script: list[tuple[int, dict[str, Any]]] | None = None):
        self.clock = clock
        self.script = script or [(200, {"ok": True, "result": {"message_id": 1}})]
        self.calls: list[tuple[float, str, dict[str, Any]]] = []

    async def send_message(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.calls.append((self.clock.now(), request.match_info["token"], payload))
        status, body = self.script[min(len(self.calls) - 1, len(self.script) - 1)]
        return web.json_response(body, status=status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/bot{token}/sendMessage", self.send_message)
        return app


@pytest.fixture
async def bot(aiohttp_server: AiohttpServer) -> tuple[BotApi, str, FakeClock]:
    clock = FakeClock()
    api = BotApi(clock)
    server = await aiohttp_server(api.app())
    return api, str(server.make_url("")).rstrip("/"), clock


def chat_target(api_base: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "telegram",
        "bot_token": "${BOT_TOKEN}",
        "chat_id": -100123,
        "api_base": api_base,
        "text": "New lead: <b>{{ form.name }}</b>",
        **extra,
    }


async def start(
    make_config: ConfigFactory, start_relay: RelayFactory, targets: dict[str, Any], clock: FakeClock
) -> Relay:
    routes = {"lead": {"path": "/hooks/lead", "targets": list(targets)}}
    config = make_config(targets, routes, environ={"BOT_TOKEN": TOKEN})
    return await start_relay(config, background=False, clock=clock)


async def submit(relay: Relay, http: aiohttp.ClientSession, name: str = "<Anna & Co>") -> None:
    async with http.post(relay.ingress_url + "/hooks/lead", data={"name": name}) as response:
        assert response.status == 200


async def test_sends_html_escaped_text(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    api, base, clock = bot
    relay = await start(make_config, start_relay, {"sales": chat_target(base)}, clock)
    await submit(relay, http)
    await relay.scheduler.drain()
    [(_, token, payload)] = api.calls
    assert token == TOKEN
    assert payload == {
        "chat_id": "-100123",
        "parse_mode": "HTML",
        "text": "New lead: <b>&lt;Anna &amp; Co&gt;</b>",
    }


@pytest.mark.parametrize(
    ("status", "description"),
    [
        (400, "Bad Request: chat not found"),
        (400, "Bad Request: can't parse entities"),
        (403, "Forbidden: bot was blocked by the user"),
    ],
)
async def test_permanent_errors(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
    status: int,
    description: str,
) -> None:
    api, base, clock = bot
    api.script = [(status, {"ok": False, "error_code": status, "description": description})]
    relay = await start(make_config, start_relay, {"sales": chat_target(base)}, clock)
    await submit(relay, http)
    await relay.scheduler.drain()
    [event] = await relay.store.list_events(EventQuery())
    delivery = event.deliveries[0]
    assert (delivery.status, delivery.attempts) == (Status.DEAD, 1)
    assert delivery.last_error == f"Telegram: {description}"


async def test_429_waits_for_retry_after_and_errors_never_show_the_token(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, base, clock = bot
    api.script = [
        (
            429,
            {
                "ok": False,
                "error_code": 429,
                "description": "Too Many Requests: retry after 37",
                "parameters": {"retry_after": 37},
            },
        ),
        (502, {"ok": False, "description": "Bad Gateway"}),
        (200, {"ok": True}),
    ]
    relay = await start(make_config, start_relay, {"sales": chat_target(base)}, clock)
    caplog.set_level(logging.INFO)
    await submit(relay, http)
    await relay.scheduler.drain()
    first, second, third = (at for at, _, _ in api.calls)
    assert second - first >= 37
    assert third > second
    [event] = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    attempts = detail.attempts[event.deliveries[0].id]
    assert [a.http_status for a in attempts] == [429, 502, 200]
    # What relay logged (the stand-in's own access log is not relay's), and stored.
    logged = [
        f"{r.getMessage()} {getattr(r, 'fields', '')}"
        for r in caplog.records
        if r.name.startswith("relay")
    ]
    text = "".join(logged) + "".join(f"{a.error}{a.response!r}" for a in attempts)
    assert "Too Many Requests" in text
    assert TOKEN not in text
    assert "secret-bot-token" not in text


class FloodedGroup(BotApi):
    """Flood control on one group: its first message is answered 429."""

    def __init__(self, clock: FakeClock, group: str, wait: int) -> None:
        super().__init__(clock)
        self.group, self.wait = group, wait

    async def send_message(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.calls.append((self.clock.now(), request.match_info["token"], payload))
        if str(payload["chat_id"]) == self.group and self.wait:
            # Bot API, ResponseParameters.retry_after: "In case of exceeding
            # flood control, the number of seconds left to wait before the
            # request can be repeated".
            wait, self.wait = self.wait, 0
            flood = {
                "ok": False,
                "error_code": 429,
                "description": f"Too Many Requests: retry after {wait}",
                "parameters": {"retry_after": wait},
            }
            return web.json_response(flood, status=429)
        return web.json_response({"ok": True, "result": {"message_id": len(self.calls)}})


async def test_a_groups_flood_wait_holds_that_chat_not_the_bots_others(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    aiohttp_server: AiohttpServer,
    http: aiohttp.ClientSession,
) -> None:
    # The 429 does not say which limit was met; the documented ones do (Bot
    # API FAQ: 1/s a chat, 20/min a group, ~30/s a bot) and relay keeps the
    # bot within its own: the wait is the group's (relay.targets.telegram,
    # held_by_a_wait). Before, a private chat waited the group's 30 s.
    clock = FakeClock()
    api = FloodedGroup(clock, group="-100123", wait=30)
    base = str((await aiohttp_server(api.app())).make_url("")).rstrip("/")
    targets = {
        "sales": chat_target(base, chat_id=-100123, text="{{ form.name }}"),
        "owner": chat_target(base, chat_id=42, text="{{ form.name }}"),
    }
    relay = await start(make_config, start_relay, targets, clock)
    for i in range(3):
        await submit(relay, http, name=f"m{i}")
    await relay.scheduler.drain()
    [flooded_at] = [at for at, _, p in api.calls if p["chat_id"] == "-100123"][:1]
    group = [(at, p["text"]) for at, _, p in api.calls if p["chat_id"] == "-100123"]
    private = [(at, p["text"]) for at, _, p in api.calls if p["chat_id"] == "42"]
    assert [text for _, text in group] == ["m0", "m0", "m1", "m2"]  # in order, m0 again
    assert all(at >= flooded_at + 30 for at, _ in group[1:])  # nothing sent into the wait
    assert [text for _, text in private] == ["m0", "m1", "m2"]
    assert all(at < flooded_at + 30 for at, _ in private)  # the private chat did not wait
    attempts = sorted(
        d.attempts for e in await relay.store.list_events(EventQuery()) for d in e.deliveries
    )
    assert attempts == [1, 1, 1, 1, 1, 2]  # the waiting messages spent no attempt
    stored = await relay.store.list_events(EventQuery())
    assert {d.status for e in stored for d in e.deliveries} == {Status.DELIVERED}


async def test_one_username_in_two_cases_is_one_chat_and_one_pace(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    # Telegram: usernames are case-insensitive. Two targets naming one group
    # as @Shop_Leads_Chat and @shop_leads_chat share its 20 messages a minute;
    # before, each had a pacer and the group got 40.
    api, base, clock = bot
    targets = {
        "leads": chat_target(base, chat_id="@Shop_Leads_Chat", text="{{ form.name }}"),
        "copies": chat_target(base, chat_id="@shop_leads_chat", text="{{ form.name }}"),
    }
    relay = await start(make_config, start_relay, targets, clock)
    for i in range(20):
        await submit(relay, http, name=f"m{i}")
    await relay.scheduler.drain()
    sent = sorted(at for at, _, _ in api.calls)
    assert len(sent) == 40
    first_minute = [at for at in sent if at < sent[0] + 60]
    assert len(first_minute) <= 20


async def test_long_text_is_cut_visibly_not_refused(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    api, base, clock = bot
    relay = await start(make_config, start_relay, {"sales": chat_target(base)}, clock)
    await submit(relay, http, name="x" * 6000)
    await relay.scheduler.drain()
    text = api.calls[0][2]["text"]
    assert len(text) <= MAX_TEXT
    assert text.endswith("</b>" + CUT_MARKER)  # the open <b> was closed before the marker


def test_cutting_never_leaves_half_a_tag_or_entity() -> None:
    room = MAX_TEXT - len(CUT_MARKER)
    for split in range(room - 8, room + 2):  # the cut lands in the entity, then in the tag
        text = "<b>" + "a" * (split - 3) + "&amp;<i>" + "x" * 100 + "</i></b>"
        result = cut(text, html=True)
        assert len(result) <= MAX_TEXT
        assert result.endswith(CUT_MARKER)
        body = result[: -len(CUT_MARKER)]
        assert body.count("<b>") == body.count("</b>")
        assert body.count("<i>") == body.count("</i>")
        inner = body.removesuffix("</b>").removesuffix("</i>")
        assert not any(inner.endswith(p) for p in ("&", "&a", "&am", "&amp", "<", "<i"))
    assert cut("short", html=True) == "short"


async def test_stays_within_telegram_limits_without_being_told(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    api, base, clock = bot
    targets = {
        "sales": chat_target(base, concurrency=4),
        "support": chat_target(base, chat_id=-100999),
    }
    relay = await start(make_config, start_relay, targets, clock)
    for i in range(5):
        await submit(relay, http, name=f"n{i}")
    await relay.scheduler.drain()
    by_chat: dict[str, list[float]] = {}
    for at, _, payload in api.calls:
        by_chat.setdefault(payload["chat_id"], []).append(at)
    for times in by_chat.values():
        assert len(times) == 5
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 1.0 - 1e-6  # one message a second per chat
    [event] = await relay.store.list_events(EventQuery(limit=1))
    assert all(d.attempts == 1 for d in event.deliveries)  # waiting is not an attempt
    assert json.loads(json.dumps(api.calls[0][2]))["chat_id"] in ("-100123", "-100999")


@pytest.mark.parametrize("chat_id", ["@shop_news", -100123, "-4012345"])
async def test_a_channel_or_group_is_paced_by_the_group_limit(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
    chat_id: str | int,
) -> None:
    # Bot API, sendMessage: chat_id is "Unique identifier for the target chat
    # or username of the target channel (in the format @channelusername)": a
    # @username is a channel or a public supergroup, never a person. Bot API
    # FAQ ("My bot is hitting limits"): no more than 20 messages a minute to
    # one group.
    api, base, clock = bot
    relay = await start(
        make_config, start_relay, {"news": chat_target(base, chat_id=chat_id)}, clock
    )
    for i in range(5):
        await submit(relay, http, name=f"n{i}")
    await relay.scheduler.drain()
    times = [at for at, _, _ in api.calls]
    assert len(times) == 5
    assert min(b - a for a, b in itertools.pairwise(times)) >= 3.0  # 60 s / 20


async def test_a_group_that_became_a_supergroup_says_where_it_moved(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    api, base, clock = bot
    # What the Bot API answers once a group is upgraded (Bot API, ResponseParameters).
    api.script = [
        (
            400,
            {
                "ok": False,
                "error_code": 400,
                "description": "Bad Request: group chat was upgraded to a supergroup chat",
                "parameters": {"migrate_to_chat_id": -1001987654321},
            },
        ),
        (200, {"ok": True, "result": {"message_id": 2}}),
    ]
    targets = {"sales": chat_target(base, chat_id=-4123)}
    relay = await start(make_config, start_relay, targets, clock)
    await submit(relay, http)
    await relay.scheduler.drain()
    [event] = await relay.store.list_events(EventQuery())
    delivery = event.deliveries[0]
    assert (delivery.status, delivery.attempts) == (Status.DEAD, 1)
    assert delivery.last_error is not None
    assert delivery.last_error.startswith(
        "Telegram: chat moved to -1001987654321: update chat_id to -1001987654321"
    )
    # The operator's fix: the new id in the config, then a requeue; it goes there.
    await relay.stop()
    moved = {"sales": chat_target(base, chat_id=-1001987654321)}
    relay = await start(make_config, start_relay, moved, clock)
    assert await relay.store.requeue(Selection(), clock.now()) == [delivery.id]
    await relay.scheduler.drain()
    assert api.calls[-1][2]["chat_id"] == "-1001987654321"


async def test_markdown_v2_escapes_values_and_the_cut_marker(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    api, base, clock = bot
    target = chat_target(base, parse_mode="MarkdownV2", text="*New lead* {{ form.name }}")
    relay = await start(make_config, start_relay, {"sales": target}, clock)
    await submit(relay, http, name="Anna_Li (VIP) +7-999.1! [x]")
    await submit(relay, http, name="y" * 5000 + ".")
    await relay.scheduler.drain()
    first, second = (payload for _, _, payload in api.calls)
    assert first["parse_mode"] == "MarkdownV2"
    assert first["text"] == "*New lead* Anna\\_Li \\(VIP\\) \\+7\\-999\\.1\\! \\[x\\]"
    assert len(second["text"]) <= MAX_TEXT
    assert second["text"].endswith(escape_markdown_v2(CUT_MARKER))
    assert "\\(cut: the message was longer than Telegram allows\\)" in second["text"]


def test_a_markdown_v2_cut_never_splits_an_escape() -> None:
    marker = escape_markdown_v2(CUT_MARKER)
    for size in range(MAX_TEXT - len(marker) - 3, MAX_TEXT - len(marker) + 3):
        text = escape_markdown_v2("." * 5000)[:size] + escape_markdown_v2("." * 10)
        result = cut(text, html=False, markdown_v2=True)
        body = result.removesuffix(marker)
        assert len(result) <= MAX_TEXT
        assert (len(body) - len(body.rstrip("\\"))) % 2 == 0


async def test_an_attempt_keeps_the_message_it_sent(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    bot: Any,
    http: aiohttp.ClientSession,
) -> None:
    # The text the chat got, rendered, beside Telegram's answer; the token in
    # the URL masked (it is a credential).
    _api, base, clock = bot
    relay = await start(make_config, start_relay, {"sales": chat_target(base)}, clock)
    await submit(relay, http, name="Анна")
    await relay.scheduler.drain()
    [event] = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    [[attempt]] = detail.attempts.values()
    assert attempt.request is not None
    assert json.loads(attempt.request.body)["text"] == "New lead: <b>Анна</b>"
    assert "Анна".encode() in attempt.request.body  # UTF-8, not \\u escapes
    assert TOKEN not in attempt.request.url
    assert attempt.request.url.endswith("/sendMessage")
