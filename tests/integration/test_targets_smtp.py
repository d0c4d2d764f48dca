"""The smtp target against a real aiosmtpd server on 127.0.0.1: plain, STARTTLS, AUTH,
implicit TLS, and 4xx (retried) vs 5xx (dead) replies."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory
from helpers import free_port

FORM = "name=%3Cb%3EAnna%3C%2Fb%3E&email=anna%40example.com&comment=Call+me&tranid=1:1"


class MailBox:
    """Accepts mail, or answers DATA from a script of replies."""

    def __init__(self, replies: list[str] | None = None) -> None:
        self.replies = list(replies or [])
        self.messages: list[Message] = []
        self.message_ids: list[str] = []
        self.envelopes: list[tuple[str, list[str]]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.content)
        self.message_ids.append(str(message["Message-ID"]))
        reply = self.replies.pop(0) if self.replies else "250 OK"
        if reply.startswith("250"):
            self.messages.append(message)
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return reply


def check_login(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and data.login == b"relay" and data.password == b"pw-123"
    return AuthResult(success=ok, handled=False)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return context


@pytest.fixture
def smtp() -> Iterator[Any]:
    started: list[Controller] = []

    def start(box: MailBox, **kwargs: Any) -> int:
        port = free_port()
        controller = Controller(box, hostname="127.0.0.1", port=port, **kwargs)
        controller.start()
        started.append(controller)
        return port

    yield start
    for controller in started:
        controller.stop()


def mail_target(port: int, **extra: Any) -> dict[str, Any]:
    return {
        "type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "tls": "none",
        "from": "Relay <relay@shop.example>",
        "to": ["manager@shop.example"],
        "cc": ["boss@shop.example"],
        "reply_to": "{{ form.email }}",
        "subject": "New lead: {{ form.name }}",
        "text": "Name: {{ form.name }}\nComment: {{ form.comment }}",
        "html": "<p>Name: {{ form.name }}</p>",
        **extra,
    }


ROUTES = {"lead": {"path": "/hooks/lead", "targets": ["mail"]}}


async def submit(relay: Relay, http: aiohttp.ClientSession) -> None:
    async with http.post(
        relay.ingress_url + "/hooks/lead",
        data=FORM.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    ) as r:
        assert r.status == 200


async def delivery_of(relay: Relay) -> Any:
    [event] = await relay.store.list_events(EventQuery())
    return event.deliveries[0]


async def test_plain_mail_with_text_html_and_stable_headers(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
) -> None:
    box = MailBox()
    port = smtp(box)
    relay = await start_relay(
        make_config({"mail": mail_target(port)}, ROUTES), background=False, clock=FakeClock()
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    [message] = box.messages
    assert message["Subject"] == "New lead: <b>Anna</b>"
    assert message["From"] == "Relay <relay@shop.example>"
    assert message["Reply-To"] == "anna@example.com"
    assert message["Cc"] == "boss@shop.example"
    assert message["X-Relay-Event-Id"] == "1"
    assert message["Message-ID"].startswith("<relay.1.mail.")
    assert box.envelopes == [("relay@shop.example", ["manager@shop.example", "boss@shop.example"])]
    text, html = [
        part.get_payload(decode=True).decode().replace("\r\n", "\n")
        for part in message.walk()
        if part.get_content_maintype() == "text"
    ]
    assert text.strip() == "Name: <b>Anna</b>\nComment: Call me"
    assert html.strip() == "<p>Name: &lt;b&gt;Anna&lt;/b&gt;</p>"  # escaped in HTML


async def test_starttls_and_auth(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
    ca: trustme.CA,
    ca_file: Path,
) -> None:
    box = MailBox()
    port = smtp(
        box,
        tls_context=server_tls(ca),
        require_starttls=True,
        auth_required=True,
        authenticator=check_login,
    )
    target = mail_target(
        port, tls="starttls", username="relay", password="${SMTP_PASSWORD}", ca_file=str(ca_file)
    )
    config = make_config({"mail": target}, ROUTES, environ={"SMTP_PASSWORD": "pw-123"})
    relay = await start_relay(config, background=False, clock=FakeClock())
    await submit(relay, http)
    await relay.scheduler.drain()
    assert len(box.messages) == 1
    assert (await delivery_of(relay)).status is Status.DELIVERED


async def test_wrong_password_is_permanent(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
    ca: trustme.CA,
    ca_file: Path,
) -> None:
    box = MailBox()
    port = smtp(
        box,
        tls_context=server_tls(ca),
        require_starttls=True,
        auth_required=True,
        authenticator=check_login,
    )
    target = mail_target(
        port, tls="starttls", username="relay", password="wrong-pw", ca_file=str(ca_file)
    )
    relay = await start_relay(
        make_config({"mail": target}, ROUTES), background=False, clock=FakeClock()
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    delivery = await delivery_of(relay)
    assert (delivery.status, delivery.attempts) == (Status.DEAD, 1)
    assert "535" in delivery.last_error
    assert "wrong-pw" not in delivery.last_error


async def test_implicit_tls(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
    ca: trustme.CA,
    ca_file: Path,
) -> None:
    box = MailBox()
    port = smtp(box, ssl_context=server_tls(ca))
    target = mail_target(port, tls="implicit", ca_file=str(ca_file))
    relay = await start_relay(
        make_config({"mail": target}, ROUTES), background=False, clock=FakeClock()
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    assert len(box.messages) == 1


async def test_untrusted_certificate_is_a_retry(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
    ca: trustme.CA,
) -> None:
    port = smtp(MailBox(), ssl_context=server_tls(ca))
    target = mail_target(port, tls="implicit", retry={"retries": 1})  # system CAs only
    relay = await start_relay(
        make_config({"mail": target}, ROUTES), background=False, clock=FakeClock()
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    delivery = await delivery_of(relay)
    assert (delivery.status, delivery.attempts) == (Status.DEAD, 2)
    assert "CERTIFICATE" in delivery.last_error.upper()


async def test_4xx_is_retried_with_the_same_message_id_and_5xx_is_dead(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
) -> None:
    box = MailBox(["451 4.3.0 Try again later", "451 4.3.0 Try again later"])
    port = smtp(box)
    relay = await start_relay(
        make_config({"mail": mail_target(port)}, ROUTES), background=False, clock=FakeClock()
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    delivery = await delivery_of(relay)
    assert (delivery.status, delivery.attempts) == (Status.DELIVERED, 3)
    assert len(set(box.message_ids)) == 1
    assert len(box.message_ids) == 3

    box.replies = ["554 5.7.1 Rejected as spam"]
    async with http.post(
        relay.ingress_url + "/hooks/lead",
        data=b"name=B&email=b@x.example&comment=hi",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    ) as r:
        assert r.status == 200
    await relay.scheduler.drain()
    newest = (await relay.store.list_events(EventQuery()))[0].deliveries[0]
    assert (newest.status, newest.attempts) == (Status.DEAD, 1)
    assert "554" in newest.last_error


@pytest.mark.parametrize("typed", ["x@@yandex.ru", "anna@", "anna at example", "a\r\nBcc: x@y.z"])
async def test_a_mistyped_reply_to_leaves_it_out_and_the_mail_goes(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
    typed: str,
) -> None:
    # The starter config's reply_to = form.Email: a customer's typo made the
    # manager's mail dead ("reply_to is not a mail address"), 5 of ~530 leads
    # in an operator's week. An optional header the template fills is left
    # out, with a note in the mail and in the journal.
    box = MailBox()
    port = smtp(box)
    config = make_config({"mail": mail_target(port, reply_to="{{ form.typed }}")}, ROUTES)
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with http.post(
        relay.ingress_url + "/hooks/lead",
        data={"name": "Anna", "typed": typed, "comment": "Call me"},
    ) as answer:
        assert answer.status == 200
    await relay.scheduler.drain()
    [message] = box.messages
    assert message["Reply-To"] is None
    assert message["Bcc"] is None
    assert "is not a mail address" in str(message["X-Relay-Note"])
    assert (await delivery_of(relay)).status is Status.DELIVERED


async def test_an_attempt_keeps_the_mail_it_sent(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    smtp: Any,
) -> None:
    # What the manager received, beside the server's reply: before, a mail
    # attempt kept nothing of its message, and a person could not tell.
    box = MailBox(["451 4.3.0 try later", "250 OK"])
    port = smtp(box)
    relay = await start_relay(
        make_config({"mail": mail_target(port, subject="Заявка: {{ form.name }}")}, ROUTES),
        background=False,
        clock=FakeClock(),
    )
    await submit(relay, http)
    await relay.scheduler.drain()
    [event] = await relay.store.list_events(EventQuery())
    detail = await relay.store.get_event(event.id)
    assert detail is not None
    refused, sent = detail.attempts[event.deliveries[0].id]
    for attempt in (refused, sent):
        assert attempt.request is not None
        assert attempt.request.method == "SMTP"
        assert attempt.request.url == f"smtp://127.0.0.1:{port}"
        headers = dict(attempt.request.headers)
        assert headers["Subject"] == "Заявка: <b>Anna</b>"  # decoded, as a mail program shows it
        assert headers["To"] == "manager@shop.example"
        assert attempt.request.body.decode() == "Name: <b>Anna</b>\nComment: Call me\n"
