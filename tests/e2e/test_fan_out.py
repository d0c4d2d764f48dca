"""A Tilda-style form fanned out by `relay serve` to a form-encoded CRM, a Telegram
stand-in and a real SMTP server; each receives what was submitted."""

from __future__ import annotations

import asyncio
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from aiosmtpd.controller import Controller
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_json, eventually, free_port, write_config

FORM = {
    "name": "Анна Петрова",
    "phone": "+7 999 000-11-22",
    "email": "anna@example.com",
    "formid": "form42",
    "tranid": "9001:77",
}


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


async def test_form_fans_out_to_crm_telegram_and_mail(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    crm = Sink(script=[200])
    crm_url = str((await aiohttp_server(crm.app())).make_url("/rest/crm.lead.add"))
    telegram_calls: list[dict[str, Any]] = []

    async def send_message(request: web.Request) -> web.Response:
        telegram_calls.append(await request.json())
        return web.json_response({"ok": True, "result": {"message_id": 1}})

    bot_app = web.Application()
    bot_app.router.add_post("/bot{token}/sendMessage", send_message)
    bot_base = str((await aiohttp_server(bot_app)).make_url("")).rstrip("/")
    inbox = Inbox()
    smtp_port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    config = write_config(
        tmp_path / "relay.toml",
        {
            "retry": {"unit": "10ms", "retries": 3},
            "targets": {
                "crm": {
                    "type": "http",
                    "url": crm_url,
                    # The event's key goes on in a header of its own, beside
                    # the delivery's Idempotency-Key (docs/reference.md).
                    "headers": {"X-Order-Key": "{{ event.idempotency_key }}"},
                    "format": "form",
                    "form": {
                        "fields[TITLE]": "Заявка: {{ form.name }}",
                        "fields[NAME]": "{{ form.name }}",
                        "fields[PHONE][0][VALUE]": "{{ form.phone }}",
                        "fields[EMAIL][0][VALUE]": "{{ form.email }}",
                    },
                },
                "sales": {
                    "type": "telegram",
                    "bot_token": "${BOT_TOKEN}",
                    "chat_id": -1001,
                    "api_base": bot_base,
                    "text": "<b>Заявка</b>\n{{ form.name }}\n{{ form.phone }}",
                },
                "manager": {
                    "type": "smtp",
                    "host": "127.0.0.1",
                    "port": smtp_port,
                    "tls": "none",
                    "from": "relay@shop.example",
                    "to": ["manager@shop.example"],
                    "reply_to": "{{ form.email }}",
                    "subject": "Заявка: {{ form.name }}",
                    "text": "{{ form.name }}, {{ form.phone }}",
                },
            },
            "routes": {
                "tilda": {
                    "path": "/hooks/tilda",
                    "idempotency_key": "{{ form.tranid }}",
                    "targets": ["crm", "sales", "manager"],
                }
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log", env={"BOT_TOKEN": "42:AAtok"}).start()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):  # Tilda retries: the second is a duplicate
                async with http.post(f"{relay.url}/hooks/tilda", data=FORM) as response:
                    assert response.status == 200

        async def delivered() -> bool:
            events = await arelay_json("events", "--config", str(config))
            return len(events) == 1 and events[0]["status"] == "delivered"

        await eventually(delivered, timeout=20)
    finally:
        await relay.astop()
        await asyncio.to_thread(controller.stop)

    [lead] = crm.requests
    assert parse_qs(lead.body.decode()) == {
        "fields[TITLE]": ["Заявка: Анна Петрова"],
        "fields[NAME]": ["Анна Петрова"],
        "fields[PHONE][0][VALUE]": ["+7 999 000-11-22"],
        "fields[EMAIL][0][VALUE]": ["anna@example.com"],
    }
    assert lead.headers["X-Order-Key"] == "9001:77"  # Tilda's tranid, the route's key
    assert lead.headers["Idempotency-Key"].startswith("msg_relay_1_")
    assert telegram_calls == [
        {
            "chat_id": "-1001",
            "parse_mode": "HTML",
            "text": "<b>Заявка</b>\nАнна Петрова\n+7 999 000-11-22",
        }
    ]
    [mail] = inbox.messages
    assert str(mail["Subject"]) == "Заявка: Анна Петрова"
    assert mail["Reply-To"] == "anna@example.com"
    body = mail.get_content()
    assert body.strip() == "Анна Петрова, +7 999 000-11-22"
