"""A Tilda lead with Tilda's default field names (Name, Email, Phone) through
the config `relay init` writes: the CRM form, the Telegram text and the mail
carry the name and the phone; `relay render` shows the same and marks what
fell back to a default.

The lead is tests/fixtures/tilda/lead-default-fields.txt (see SOURCE.md there).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from relay.cli.setup import starter_config
from relay.core.clock import FakeClock
from relay.loader import parse_config

from conftest import RelayFactory, SinkFactory
from helpers import admin_credentials, free_port, relay_cli

LEAD = (Path(__file__).resolve().parents[1] / "fixtures/tilda/lead-default-fields.txt").read_bytes()
ENV = {
    "TILDA_API_KEY": "tilda-key",
    "TELEGRAM_BOT_TOKEN": "123456:AAbot",
    "TELEGRAM_CHAT_ID": "-1001234567890",
    "SMTP_HOST": "127.0.0.1",
    "SMTP_USER": "relay",
    "SMTP_PASSWORD": "pw-123",
    "MAIL_FROM": "relay@example.com",
    "MAIL_TO": "manager@example.com",
}


class MailBox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


def login(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and data.login == b"relay" and data.password == b"pw-123"
    return AuthResult(success=ok, handled=False)


@pytest.fixture
def mailbox() -> Iterator[tuple[MailBox, int]]:
    box = MailBox()
    port = free_port()
    controller = Controller(
        box, hostname="127.0.0.1", port=port, authenticator=login, auth_require_tls=False
    )
    controller.start()
    yield box, port
    controller.stop()


async def test_a_tilda_lead_reaches_crm_chat_and_mail_with_name_and_phone(
    tmp_path: Path,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    mailbox: tuple[MailBox, int],
    http: aiohttp.ClientSession,
) -> None:
    crm, crm_url = await start_sink(path="/rest/1/abc123")
    telegram, telegram_url = await start_sink(
        lambda request, n: aiohttp.web.json_response({"ok": True, "result": {}}), path=""
    )
    box, smtp_port = mailbox
    data = tomllib.loads(starter_config())
    # Only where things run changes; every template is the starter's own.
    data["server"]["listen"] = "127.0.0.1:0"
    data["admin"]["listen"] = "127.0.0.1:0"
    data["targets"]["sales_chat"]["api_base"] = telegram_url.rstrip("/")
    data["targets"]["manager_mail"].update(port=smtp_port, tls="none")
    env = {**ENV, "BITRIX_WEBHOOK_URL": crm_url, **admin_credentials(tmp_path / "credentials")}
    relay = await start_relay(
        parse_config(data, env, base=tmp_path), background=False, clock=FakeClock()
    )
    async with http.post(
        relay.ingress_url + "/hooks/tilda",
        data=LEAD,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Tilda-Api-Key": "tilda-key",
        },
    ) as response:
        assert (response.status, await response.text()) == (200, "ok")
    await relay.scheduler.drain()

    [lead] = crm.requests
    fields = parse_qs(lead.body.decode())
    assert fields["fields[TITLE]"] == ["Lead from the site: Анна Петрова"]
    assert fields["fields[NAME]"] == ["Анна Петрова"]
    assert fields["fields[PHONE][0][VALUE]"] == ["+7 (999) 000-00-01"]
    assert fields["fields[EMAIL][0][VALUE]"] == ["anna@example.com"]

    [message] = telegram.requests
    text = json.loads(message.body)["text"]
    assert "Анна Петрова, +7 (999) 000-00-01" in text
    assert "anna@example.com" in text

    [mail] = box.messages
    body = mail.get_payload(decode=True)
    assert isinstance(body, bytes)
    assert "Name: Анна Петрова\r\nPhone: +7 (999) 000-00-01" in body.decode()
    assert "Анна Петрова" in str(mail["Subject"]) or "=?utf-8?" in str(mail["Subject"])


def test_relay_render_on_the_starter_config_shows_the_lead_and_marks_defaults(
    tmp_path: Path,
) -> None:
    config = tmp_path / "relay.toml"
    relay_cli("init", str(config))
    sample = tmp_path / "lead.txt"
    sample.write_bytes(LEAD)
    env = {**ENV, "BITRIX_WEBHOOK_URL": "https://example.bitrix24.ru/rest/1/abc123"}
    out = relay_cli(
        "render", "tilda", "--body", str(sample), "--config", str(config), env=env, check=False
    ).stdout
    # The path ingress takes: Tilda's profile (no API key in the sample: said so) and its key.
    assert "ingress would refuse this request with 401: missing_api_key" in out
    assert "idempotency key: 3516279:4213568" in out
    assert "  fields[TITLE] = Lead from the site: Анна Петрова" in out
    assert "  fields[PHONE][0][VALUE] = +7 (999) 000-00-01" in out
    assert "Анна Петрова, +7 (999) 000-00-01" in out
    # The starter reads a comment field this form does not have: marked, not silently empty.
    assert "NOTE: fell back to a default (no comment = '')" in out
