"""What a target's answer, its network and its server can do to a delivery,
seen through relay: a 200 whose body stalls, a Retry-After no one can read,
control characters in an answer, a server that drops idle connections, a
redirect, a header no server should be sent, a private CA, a client
certificate, an HTTP proxy. Real servers on 127.0.0.1 each time."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
import pytest
import trustme
from aiohttp import web

from relay.app import Relay
from relay.cli.advice import warnings
from relay.config import ConfigError
from relay.core.clock import FakeClock
from relay.core.secrets import Masker
from relay.loader.load import load_config
from relay.ops.logs import TextFormatter
from relay.store import EventDetail, EventQuery

from conftest import TRANSPORTS, ConfigFactory, RelayFactory, SinkFactory
from helpers import ForwardingProxy

ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs over each HTTP transport (tests/conftest.py)."""
    value: str = request.param
    return value


class Raw:
    """A TCP server on 127.0.0.1 whose `handler` does what it likes with each connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.server: asyncio.AbstractServer | None = None
        self.connections = 0

    async def start(self) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[Raw, str]]]]:
    started: list[Raw] = []

    async def start(handler: Handler) -> tuple[Raw, str]:
        server = Raw(handler)
        started.append(server)
        return server, await server.start()

    yield start
    for server in started:
        if server.server is not None:
            server.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def post_order(relay: Relay, body: bytes = b'{"order": 1}') -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/orders",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as answer,
    ):
        assert answer.status == 200
        return int((await answer.json())["id"])


async def detail(relay: Relay, event_id: int) -> EventDetail:
    found = await relay.store.get_event(event_id)
    assert found is not None
    return found


_databases = itertools.count()


def target(url: str, **more: Any) -> dict[str, Any]:
    return {"type": "http", "url": url, "retry": {"retries": 1}, **more}


async def deliver_one(
    make_config: ConfigFactory, start_relay: RelayFactory, crm: dict[str, Any], **config: Any
) -> tuple[Relay, EventDetail]:
    """One event through a relay whose one target is `crm`, its retry cycle run
    out (a database of its own: a test may start several)."""
    config.setdefault("storage", {"path": f"relay-{next(_databases)}.db"})
    relay = await start_relay(
        make_config({"crm": crm}, ROUTES, **config), background=False, clock=FakeClock()
    )
    event_id = await post_order(relay)
    await relay.scheduler.drain()
    return relay, await detail(relay, event_id)


# 34.7: a 200 whose body never ends


async def test_a_200_whose_body_stalls_is_delivered_with_a_note(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    raw: Callable[[Handler], Awaitable[tuple[Raw, str]]],
) -> None:
    """Before: every attempt was "timeout after 1s" and the delivery was sent
    again until dead, though the target had said 200 each time."""

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"id": 7')
        await writer.drain()
        await asyncio.sleep(3600)

    server, url = await raw(stalls)
    # A short limit: its length is not the point (the attempt ends a tenth of it early).
    crm = target(url, retry={"retries": 1, "timeout": "300ms"})
    _, found = await deliver_one(make_config, start_relay, crm)
    [delivery] = found.event.deliveries
    assert (delivery.status.value, delivery.attempts) == ("delivered", 1)
    [attempt] = found.attempts[delivery.id]
    assert (attempt.outcome, attempt.http_status) == ("success", 200)
    assert attempt.response == b'{"id": 7'
    assert attempt.error is not None
    assert "body stopped coming" in attempt.error
    assert attempt.duration < 0.3  # returned before the time limit, not cut by it
    assert server.connections == 1


async def test_a_503_whose_body_stalls_keeps_its_status(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    raw: Callable[[Handler], Awaitable[tuple[Raw, str]]],
) -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 1000\r\n\r\nbus")
        await writer.drain()
        await asyncio.sleep(3600)

    _, url = await raw(stalls)
    crm = target(url, retry={"retries": 1, "timeout": "300ms"})
    _, found = await deliver_one(make_config, start_relay, crm)
    [delivery] = found.event.deliveries
    assert (delivery.status.value, delivery.attempts) == ("dead", 2)
    for attempt in found.attempts[delivery.id]:
        assert (attempt.outcome, attempt.http_status, attempt.response) == ("retry", 503, b"bus")
    assert delivery.last_error is not None
    assert delivery.last_error.startswith("HTTP 503")


# 34.8: Retry-After: ² (0xB2, a superscript two in Latin-1)


async def test_an_unreadable_retry_after_is_ignored_and_the_503_kept(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    raw: Callable[[Handler], Awaitable[tuple[Raw, str]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: "²".isdigit() is True, float("²") a ValueError: every attempt was
    "internal error: ValueError" with a traceback, the 503 lost."""

    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: \xb2\r\nContent-Length: 4\r\n\r\nbusy")
            await writer.drain()

    _, url = await raw(busy)
    _, found = await deliver_one(make_config, start_relay, target(url))
    [delivery] = found.event.deliveries
    assert (delivery.status.value, delivery.attempts) == ("dead", 2)
    first, second = found.attempts[delivery.id]
    for attempt in (first, second):
        assert (attempt.outcome, attempt.http_status, attempt.error) == ("retry", 503, "HTTP 503")
    # The normal backoff: retry 1 two seconds later (jitter 0), not the header's.
    assert first.next_attempt_at is not None
    assert first.next_attempt_at - first.started_at == pytest.approx(2.0, abs=0.01)
    assert not [record for record in caplog.records if record.exc_info]


# 34.9: control characters in what a target says


async def test_control_characters_in_an_answer_are_escaped_in_errors_and_log_lines(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: the ESC bytes of a CRM's message reached `last_error` and the
    journal as they were: an operator tailing it got the terminal recoloured,
    and a line break forged a log line of the target's choosing."""
    said = "\x1b[2J\x1b[31mpwned\x1b[0m\nINFO relay forged line\r\x07"

    def hostile(request: web.Request, number: int) -> web.Response:
        return web.json_response({"message": said}, status=400)

    _, url = await start_sink(hostile)
    caplog.set_level(logging.INFO, logger="relay.attempts")
    _, found = await deliver_one(make_config, start_relay, target(url))
    [delivery] = found.event.deliveries
    assert delivery.status.value == "dead"
    expected = "HTTP 400: \\x1b[2J\\x1b[31mpwned\\x1b[0m INFO relay forged line \\x07"
    assert delivery.last_error == expected
    [attempt] = found.attempts[delivery.id]
    assert attempt.error == expected
    formatter = TextFormatter(Masker())
    lines = [formatter.format(r) for r in caplog.records if r.name == "relay.attempts"]
    assert lines
    assert all("\x1b" not in line and "\x07" not in line for line in lines)
    assert any("\\x1b[31mpwned" in line for line in lines)


def test_a_text_log_line_escapes_control_characters_whatever_it_quotes() -> None:
    quoted = ("a\x1b]0;x\x07",)
    record = logging.LogRecord("relay", logging.WARNING, "", 0, "target %s", quoted, None)
    assert TextFormatter(Masker()).format(record).endswith("target a\\x1b]0;x\\x07")


# 38.3: a server that drops idle kept-alive connections


async def test_a_server_that_drops_idle_connections_fails_no_attempt(
    make_config: ConfigFactory, start_relay: RelayFactory
) -> None:
    """aiohttp's server with keepalive_timeout=0.25 s (Node's default is 5 s,
    gunicorn's 2 s; the length does not matter, the gaps around it do):
    events come at gaps around it, so relay's kept connection is closed
    before, as and after it is taken again."""
    received: list[str] = []

    async def crm(request: web.Request) -> web.Response:
        received.append(await request.text())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/hook", crm)
    idle = 0.25
    runner = web.AppRunner(app, keepalive_timeout=idle)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        relay = await start_relay(make_config({"crm": target(url)}, ROUTES), poll_interval=0.02)
        gaps = [idle * share for share in (0.0, 0.9, 0.97, 1.0, 1.02, 1.05, 1.2, 0.3)]
        ids = []
        for number, gap in enumerate(gaps):
            await asyncio.sleep(gap)  # real time: the server's idle timer is real
            ids.append(await post_order(relay, b'{"order": %d}' % number))
            for _ in range(200):
                if len(received) > number:
                    break
                await asyncio.sleep(0.01)
        for event_id in ids:
            found = await detail(relay, event_id)
            [delivery] = found.event.deliveries
            assert (delivery.status.value, delivery.attempts) == ("delivered", 1)
            assert [a.outcome for a in found.attempts[delivery.id]] == ["success"]
    finally:
        await runner.cleanup()


async def test_a_connection_closed_as_the_next_request_arrives_costs_no_attempt(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    raw: Callable[[Handler], Awaitable[tuple[Raw, str]]],
) -> None:
    """The race the test above can only sometimes meet, every time: each
    connection's second request is read and the connection closed unanswered.
    Before: every other delivery had a failed attempt ("server closed the
    connection without answering") and waited out a backoff."""
    seen: list[bytes] = []

    async def idle_timeout_as_it_arrives(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        seen.append(await read_request(reader))  # then closed, no answer

    _, url = await raw(idle_timeout_as_it_arrives)
    relay = await start_relay(
        make_config({"crm": target(url)}, ROUTES), background=False, clock=FakeClock()
    )
    ids = []
    for number in range(4):  # one after the other: each on the kept connection
        ids.append(await post_order(relay, b'{"order": %d}' % number))
        await relay.scheduler.drain()
    for event_id in ids:
        found = await detail(relay, event_id)
        [delivery] = found.event.deliveries
        assert [a.outcome for a in found.attempts[delivery.id]] == ["success"]
    # Each key went out once more only where a connection was closed under it.
    assert len(seen) > len(ids)
    assert all(b"Idempotency-Key: " in request for request in seen)


# 38.6, 53: header values, by one rule for every HTTP header


def test_a_header_written_with_a_line_break_is_refused_at_load(
    make_config: ConfigFactory,
) -> None:
    crm = target("http://127.0.0.1:9/hook", headers={"X-Source": "site\r\nX-Evil: 1"})
    with pytest.raises(ConfigError, match=r"targets\.crm\.headers\.X-Source.*line break"):
        make_config({"crm": crm}, ROUTES)


async def test_a_header_that_cannot_go_as_it_is_goes_by_one_rule_never_dead(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # Before: a templated header rendering Cyrillic (a 1C order number, a
    # customer's name) made every delivery of such an event dead at once, and a
    # requeue could not help. Non-ASCII text goes percent-encoded as UTF-8 (it
    # reads back exactly), a control character (a line break from the payload)
    # as a space: never a second header.
    sink, url = await start_sink([200])
    headers = {
        "X-Customer": "{{ json.name }}",
        "X-Order": "{{ json.order }}",
        "X-Note": "{{ json.note }}",
        "X-Source": "Сайт",
    }
    relay = await start_relay(
        make_config({"crm": target(url, headers=headers)}, ROUTES),
        background=False,
        clock=FakeClock(),
    )
    body = '{"name": "Анна 100%", "order": "ЗК-000123", "note": "a\\r\\nX-Evil: 1"}'
    event = await post_order(relay, body.encode())
    await relay.scheduler.drain()
    [delivery] = (await detail(relay, event)).event.deliveries
    assert delivery.status.value == "delivered"
    [request] = sink.requests
    assert unquote(request.headers["X-Customer"]) == "Анна 100%"
    assert request.headers["X-Customer"] == "%D0%90%D0%BD%D0%BD%D0%B0%20100%25"
    assert unquote(request.headers["X-Order"]) == "ЗК-000123"
    assert unquote(request.headers["X-Source"]) == "Сайт"
    assert request.headers["X-Note"] == "a  X-Evil: 1"
    assert "X-Evil" not in request.headers


async def test_a_targets_own_header_replaces_relays_whatever_its_case(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # Before: a target's Idempotency-Key was overwritten by relay's, and the
    # same header in another case went out beside relay's: two fields.
    sink, url = await start_sink([200])
    headers = {
        "idempotency-key": "order-{{ json.id }}",
        "content-type": "application/json; charset=utf-8",
    }
    relay = await start_relay(
        make_config({"crm": target(url, headers=headers)}, ROUTES),
        background=False,
        clock=FakeClock(),
    )
    await post_order(relay, b'{"id": 7}')
    await relay.scheduler.drain()
    [request] = sink.requests
    assert request.headers.getall("Idempotency-Key") == ["order-7"]
    assert request.headers.getall("Content-Type") == ["application/json; charset=utf-8"]


def test_a_signing_header_is_relays_when_the_target_signs(make_config: ConfigFactory) -> None:
    crm = target(
        "http://127.0.0.1:9/hook",
        headers={"Webhook-Id": "{{ json.id }}"},
        sign="whsec_" + base64.b64encode(b"k" * 24).decode(),
    )
    with pytest.raises(ConfigError, match=r"headers\.Webhook-Id.*written by relay when sign"):
        make_config({"crm": crm}, ROUTES)


# 38.4: redirects


def redirecting(status: int, location: Callable[[web.Request], str]) -> Any:
    """A sink script: `status` to `location` for /hook, 200 elsewhere."""

    def script(request: web.Request, number: int) -> web.Response:
        if request.path == "/hook":
            return web.Response(status=status, headers={"Location": location(request)})
        return web.Response(text="moved in")

    return script


async def test_a_redirect_not_followed_says_where_it_pointed_and_what_to_change(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    """Before: "HTTP 301: redirects are not followed", nothing on where to."""
    moved = "https://crm.example/api/v2/leads"
    _, url = await start_sink(redirecting(301, lambda request: moved))
    _, found = await deliver_one(make_config, start_relay, target(url))
    [delivery] = found.event.deliveries
    assert (delivery.status.value, delivery.attempts) == ("dead", 1)
    assert delivery.last_error is not None
    assert delivery.last_error.startswith(f"HTTP 301 to {moved}: not followed")
    assert "set its url to this one" in delivery.last_error
    _, url = await start_sink(redirecting(308, lambda request: "/v2/hook"))
    _, found = await deliver_one(make_config, start_relay, target(url))
    [delivery] = found.event.deliveries
    assert delivery.last_error is not None
    # A relative Location, shown whole.
    assert delivery.last_error.startswith(f"HTTP 308 to {url.removesuffix('/hook')}/v2/hook")
    assert "follow_redirects = true" in delivery.last_error


async def test_follow_redirects_takes_307_and_308_with_method_and_body_to_the_same_host(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    for status in (307, 308):
        sink, url = await start_sink(redirecting(status, lambda request: "/v2/hook?x=1"))
        crm = target(url, method="PUT", follow_redirects=True)
        _, found = await deliver_one(make_config, start_relay, crm)
        [delivery] = found.event.deliveries
        assert (delivery.status.value, delivery.attempts) == ("delivered", 1)
        first, second = sink.requests
        assert (first.method, first.path) == ("PUT", "/hook")
        assert (second.method, second.path) == ("PUT", "/v2/hook?x=1")
        assert second.body == first.body == b'{"order": 1}'
        assert second.headers["Idempotency-Key"] == first.headers["Idempotency-Key"]


async def test_followed_redirects_stop_at_other_hosts_301s_and_loops(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    def elsewhere(request: web.Request) -> str:
        return f"http://localhost:{request.url.port}/v2"

    sink, url = await start_sink(redirecting(308, elsewhere))
    _, found = await deliver_one(make_config, start_relay, target(url, follow_redirects=True))
    [delivery] = found.event.deliveries
    assert delivery.status.value == "dead"
    assert delivery.last_error is not None
    assert "another origin (scheme, host and port), not followed unless" in delivery.last_error
    assert len(sink.requests) == 1
    allowed = target(url, follow_redirects=True, redirect_hosts=["localhost"])
    _, found = await deliver_one(make_config, start_relay, allowed)
    assert found.event.deliveries[0].status.value == "delivered"
    assert [r.path for r in sink.requests[1:]] == ["/hook", "/v2"]

    sink, url = await start_sink(redirecting(302, lambda request: "/v2"))
    _, found = await deliver_one(make_config, start_relay, target(url, follow_redirects=True))
    assert "302 may turn a POST into a GET" in (found.event.deliveries[0].last_error or "")

    sink, url = await start_sink(redirecting(308, lambda request: "/hook"))
    _, found = await deliver_one(make_config, start_relay, target(url, follow_redirects=True))
    [delivery] = found.event.deliveries
    assert (delivery.status.value, delivery.attempts) == ("dead", 1)
    assert (delivery.last_error or "").startswith("more than 5 redirects")
    assert len(sink.requests) == 6


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_redirect_never_reaches_relays_own_listeners(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    """Hardening round three, item 6: a local target's 307 to relay's admin API
    (no token) requeued every delivered delivery. Relay's own listeners are
    never a redirect's destination, even on a host redirect_hosts lists."""
    ingress, admin = free_port(), free_port()
    listeners = {
        "admin": f"http://127.0.0.1:{admin}/api/v1/requeue",
        "ingress": f"http://localhost:{ingress}/hooks/orders",
    }
    for name, location in listeners.items():
        _, url = await start_sink(redirecting(307, lambda request, to=location: to))
        crm = target(url, follow_redirects=True, redirect_hosts=["127.0.0.1", "localhost"])
        relay, found = await deliver_one(
            make_config,
            start_relay,
            crm,
            server={"listen": f"127.0.0.1:{ingress}"},
            admin={"listen": f"127.0.0.1:{admin}"},
        )
        [delivery] = found.event.deliveries
        assert (delivery.status.value, delivery.attempts) == ("dead", 1), name
        assert delivery.last_error == (
            f"HTTP 307 to {location}: one of relay's own listeners, never followed"
        )
        assert len(await relay.store.list_events(EventQuery(limit=10))) == 1  # no event of its own
        await relay.stop()


async def test_a_307_to_another_port_of_the_same_host_is_another_origin(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    """Hardening round three, item 8: the URL's user:password went to another
    port of the same host (another server). Now another port is another
    origin: not followed unless its host is listed, and then without them."""
    elsewhere, other = await start_sink()
    sink, url = await start_sink(redirecting(307, lambda request: other))
    with_password = url.replace("http://", "http://crm:s3cret@")
    _, found = await deliver_one(
        make_config, start_relay, target(with_password, follow_redirects=True)
    )
    [delivery] = found.event.deliveries
    assert delivery.status.value == "dead"
    assert "another origin (scheme, host and port)" in (delivery.last_error or "")
    assert elsewhere.requests == []
    listed = target(with_password, follow_redirects=True, redirect_hosts=["127.0.0.1"])
    _, found = await deliver_one(make_config, start_relay, listed)
    assert found.event.deliveries[0].status.value == "delivered"
    [moved] = elsewhere.requests
    assert "Authorization" not in moved.headers
    assert sink.requests[-1].headers["Authorization"].startswith("Basic ")


async def test_a_location_that_is_not_http_is_a_clean_failure(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hardening round three, item 8: `Location: file:///...` was an internal
    error with a traceback. Any Location is an Outcome with a one-line reason."""
    for location in ("file:///etc/passwd", "gopher://127.0.0.1/", "data:text/plain,hi"):
        _, url = await start_sink(redirecting(307, lambda request, to=location: to))
        crm = target(url, follow_redirects=True, redirect_hosts=["127.0.0.1"])
        with caplog.at_level(logging.WARNING):
            _, found = await deliver_one(make_config, start_relay, crm)
        [delivery] = found.event.deliveries
        assert (delivery.status.value, delivery.attempts) == ("dead", 1)
        assert delivery.last_error == f"HTTP 307 to {location}: not an http(s) URL, never followed"
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


# 38.2: a private CA, a client certificate, tls_verify = false


class TLSFiles:
    """A CA of its own (trustme), a server certificate for 127.0.0.1 and a
    client certificate, each written where a config can name it."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = folder / "crm-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        client = self.ca.issue_cert("relay@shop.example")
        self.client_cert = folder / "relay-client.pem"
        self.client_key = folder / "relay-client.key"
        self.client_both = folder / "relay-client-and-key.pem"
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))
        client.private_key_and_cert_chain_pem.write_to_path(str(self.client_both))

    def server(self, *, client_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        if client_certificate:
            context.verify_mode = ssl.CERT_REQUIRED
            self.ca.configure_trust(context)
        return context


async def tls_sink(context: ssl.SSLContext) -> tuple[list[web.Request], str, web.AppRunner]:
    seen: list[web.Request] = []

    async def crm(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request)
        return web.json_response({"ok": True, "result": {}})

    app = web.Application()
    app.router.add_post("/{tail:.*}", crm)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    return seen, f"https://127.0.0.1:{runner.addresses[0][1]}", runner


TLSSinks = Callable[[ssl.SSLContext], Awaitable[tuple[list[Any], str]]]


@pytest.fixture
async def tls_sinks() -> AsyncIterator[TLSSinks]:
    runners: list[web.AppRunner] = []

    async def start(context: ssl.SSLContext) -> tuple[list[Any], str]:
        seen, url, runner = await tls_sink(context)
        runners.append(runner)
        return seen, url

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_a_crm_behind_a_private_ca_is_reached_with_ca_file(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
) -> None:
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server())
    _, found = await deliver_one(make_config, start_relay, target(f"{url}/hook"))
    [delivery] = found.event.deliveries
    assert delivery.status.value == "dead"
    assert "CERTIFICATE_VERIFY_FAILED" in (delivery.last_error or "")
    assert seen == []
    crm = target(f"{url}/hook", ca_file=str(files.ca_file))
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    assert len(seen) == 1


async def test_a_crm_that_wants_a_client_certificate_gets_relays(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
) -> None:
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server(client_certificate=True))
    without = target(f"{url}/hook", ca_file=str(files.ca_file))
    _, found = await deliver_one(make_config, start_relay, without)
    assert found.event.deliveries[0].status.value == "dead"
    assert seen == []
    for keys in (
        {"client_cert": str(files.client_cert), "client_key": str(files.client_key)},
        {"client_cert": str(files.client_both)},  # the key in the same file
    ):
        crm = target(f"{url}/hook", ca_file=str(files.ca_file), **keys)
        _, found = await deliver_one(make_config, start_relay, crm)
        assert found.event.deliveries[0].status.value == "delivered"
    assert len(seen) == 2
    peer = seen[0].transport.get_extra_info("peercert") if seen[0].transport else None
    assert peer is not None  # the server saw relay's certificate


async def test_tls_verify_false_takes_any_certificate_and_relay_check_says_so_loudly(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
) -> None:
    _, url = await tls_sinks(TLSFiles(tmp_path).server())
    crm = target(f"{url}/hook", tls_verify=False)
    relay, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    [warning] = [w for w in warnings(relay.config) if "tls_verify" in w]
    assert warning.startswith("targets.crm.tls_verify: FALSE: any certificate is taken")
    safe = make_config({"crm": target(f"{url}/hook")}, ROUTES)
    assert not [w for w in warnings(safe) if "tls_verify" in w]


def test_tls_files_that_cannot_be_used_are_refused_at_load(
    tmp_path: Path, make_config: ConfigFactory
) -> None:
    files = TLSFiles(tmp_path)
    url = "https://crm.example/hook"
    for keys, expected in (
        ({"ca_file": str(tmp_path / "nope.pem")}, r"targets\.crm\.ca_file: .*no such file"),
        ({"ca_file": str(files.client_key)}, r"targets\.crm\.ca_file: .*not a PEM file"),
        ({"client_key": str(files.client_key)}, r"client_key: is used only with client_cert"),
        ({"client_cert": str(files.client_cert)}, r"targets\.crm\.client_cert: cannot load"),
        ({"client_cert": str(tmp_path / "nope.pem")}, r"client_cert: .*no such file"),
    ):
        with pytest.raises(ConfigError, match=expected):
            make_config({"crm": target(url, **keys)}, ROUTES)


async def test_a_308_to_https_on_the_same_host_is_followed_to_a_private_ca(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    tls_sinks: TLSSinks,
) -> None:
    """A CRM that moved from http:// to https://. Here on another port, which
    makes it another origin: followed because its host is listed (on the
    default ports, http://crm to https://crm is followed unlisted)."""
    files = TLSFiles(tmp_path)
    seen, secure = await tls_sinks(files.server())
    plain, url = await start_sink(redirecting(308, lambda request: f"{secure}/hook"))
    crm = target(
        url, follow_redirects=True, redirect_hosts=["127.0.0.1"], ca_file=str(files.ca_file)
    )
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    assert (len(plain.requests), len(seen)) == (1, 1)


async def test_a_telegram_target_takes_the_same_tls_options(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
) -> None:
    """A local Bot API server behind a private CA that wants a client certificate."""
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server(client_certificate=True))
    chat = {
        "type": "telegram",
        "bot_token": "123456:ABC-DEF",
        "chat_id": 42,
        "api_base": url,
        "ca_file": str(files.ca_file),
        "client_cert": str(files.client_both),
        "retry": {"retries": 1},
    }
    _, found = await deliver_one(make_config, start_relay, chat)
    assert found.event.deliveries[0].status.value == "delivered"
    assert [request.path for request in seen] == ["/bot123456:ABC-DEF/sendMessage"]


# 38.1: proxies


@pytest.fixture
async def proxies() -> AsyncIterator[Callable[..., Awaitable[ForwardingProxy]]]:
    started: list[ForwardingProxy] = []

    async def start(credentials: str | None = None) -> ForwardingProxy:
        proxy = ForwardingProxy(credentials)
        started.append(proxy)
        await proxy.start()
        return proxy

    yield start
    for proxy in started:
        await proxy.close()


PROXY_PASSWORD = "pr0xy-s3cret"
BASIC = "Basic " + base64.b64encode(f"relay:{PROXY_PASSWORD}".encode()).decode()


async def test_https_through_a_proxy_is_a_connect_tunnel_with_its_credentials(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
    proxies: Callable[..., Awaitable[ForwardingProxy]],
) -> None:
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server())
    proxy = await proxies(f"relay:{PROXY_PASSWORD}")
    with_proxy = f"http://relay:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
    crm = target(f"{url}/hook", proxy=with_proxy, ca_file=str(files.ca_file))
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    authority = url.removeprefix("https://")
    assert proxy.seen == [(f"CONNECT {authority} HTTP/1.1", BASIC)]
    # TLS end to end through the tunnel: the certificate checked is the CRM's.
    assert len(seen) == 1
    assert "Proxy-Authorization" not in seen[0].headers


async def test_http_through_a_proxy_goes_in_absolute_form(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    proxies: Callable[..., Awaitable[ForwardingProxy]],
) -> None:
    sink, url = await start_sink([200])
    proxy = await proxies(f"relay:{PROXY_PASSWORD}")
    crm = target(url, proxy=f"http://relay:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}")
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    assert proxy.seen == [(f"POST {url} HTTP/1.1", BASIC)]
    [request] = sink.requests
    assert request.body == b'{"order": 1}'


async def test_the_environments_proxy_is_used_unless_no_proxy_or_none_says_otherwise(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
    proxies: Callable[..., Awaitable[ForwardingProxy]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As curl, httpx and aiohttp's trust_env read them: a VPS whose provider
    requires an egress proxy sets HTTPS_PROXY once, for every program."""
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server())
    proxy = await proxies()
    monkeypatch.setenv("HTTPS_PROXY", f"127.0.0.1:{proxy.port}")  # no scheme: as curl takes it
    crm = target(f"{url}/hook", ca_file=str(files.ca_file))
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    assert [line for line, _ in proxy.seen] == [f"CONNECT {url.removeprefix('https://')} HTTP/1.1"]
    # Exempt by NO_PROXY, or by proxy = "none": straight to the CRM.
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    _, found = await deliver_one(make_config, start_relay, crm)
    assert found.event.deliveries[0].status.value == "delivered"
    monkeypatch.delenv("NO_PROXY")
    _, found = await deliver_one(make_config, start_relay, {**crm, "proxy": "none"})
    assert found.event.deliveries[0].status.value == "delivered"
    assert len(proxy.seen) == 1
    assert len(seen) == 3


async def test_a_proxys_credentials_are_never_shown(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
    proxies: Callable[..., Awaitable[ForwardingProxy]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = TLSFiles(tmp_path)
    _, url = await tls_sinks(files.server())
    proxy = await proxies("relay:another-password")
    with_proxy = f"http://relay:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
    crm = target(f"{url}/hook", proxy=with_proxy, ca_file=str(files.ca_file))
    caplog.set_level(logging.INFO)
    relay, found = await deliver_one(make_config, start_relay, crm)
    [delivery] = found.event.deliveries
    assert delivery.status.value == "dead"
    assert delivery.last_error is not None
    assert delivery.last_error.startswith(f"proxy 127.0.0.1:{proxy.port} refused CONNECT")
    assert "HTTP 407 (proxy credentials refused)" in delivery.last_error
    formatter = TextFormatter(relay.config.masker)
    shown = [delivery.last_error, *(formatter.format(r) for r in caplog.records)]
    assert not [line for line in shown if PROXY_PASSWORD in line]
    # The password is one of the config's secrets: masked in any line naming it.
    assert PROXY_PASSWORD not in relay.config.masker.text(f"said {PROXY_PASSWORD}")


@pytest.mark.parametrize("proxy", ["https://proxy.example:3128", "socks5://u:pw@proxy.example"])
def test_a_proxy_that_is_not_an_http_url_is_refused_without_echoing_it(
    proxy: str, make_config: ConfigFactory
) -> None:
    crm = target("https://crm.example/hook", proxy=proxy)
    with pytest.raises(ConfigError, match=r"targets\.crm\.proxy: expected") as refused:
        make_config({"crm": crm}, ROUTES)
    assert proxy not in str(refused.value)


async def test_a_telegram_target_reaches_the_bot_api_through_a_proxy(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    tls_sinks: TLSSinks,
    proxies: Callable[..., Awaitable[ForwardingProxy]],
) -> None:
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server())
    proxy = await proxies()
    chat = {
        "type": "telegram",
        "bot_token": "123456:ABC-DEF",
        "chat_id": 42,
        "api_base": url,
        "proxy": proxy.url,
        "ca_file": str(files.ca_file),
        "retry": {"retries": 1},
    }
    _, found = await deliver_one(make_config, start_relay, chat)
    assert found.event.deliveries[0].status.value == "delivered"
    assert [line for line, _ in proxy.seen] == [f"CONNECT {url.removeprefix('https://')} HTTP/1.1"]
    assert len(seen) == 1


def test_relay_check_warns_of_a_proxy_password_written_in_a_readable_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.toml"
    for proxy, warned in (
        ("http://relay:pr0xy-s3cret@proxy.corp:3128", True),
        ("http://relay:${PROXY_PASSWORD}@proxy.corp:3128", False),
        ("http://proxy.corp:3128", False),
    ):
        path.write_text(
            "[storage]\npath = 'relay.db'\n"
            f'[targets.crm]\ntype = "http"\nurl = "https://crm.example/"\nproxy = "{proxy}"\n'
            '[routes.orders]\npath = "/hooks/orders"\ntargets = ["crm"]\n',
            encoding="utf-8",
        )
        path.chmod(0o644)
        config = load_config(path, {"PROXY_PASSWORD": "pw"})
        found = [w for w in warnings(config) if w.startswith("targets.crm.proxy")]
        assert bool(found) == warned, (proxy, found)


async def test_a_client_certificate_renewed_in_place_is_taken_up_by_a_reload(
    tmp_path: Path, make_config: ConfigFactory, start_relay: RelayFactory, tls_sinks: TLSSinks
) -> None:
    """Client certificates are short-lived (renewed by a timer, written over
    the old file): a SIGHUP reload with the same config must use the new one."""
    files = TLSFiles(tmp_path)
    seen, url = await tls_sinks(files.server(client_certificate=True))
    stranger = trustme.CA().issue_cert("relay@shop.example")  # a CA the CRM does not trust
    stranger.private_key_and_cert_chain_pem.write_to_path(str(files.client_both))
    crm = target(f"{url}/hook", ca_file=str(files.ca_file), client_cert=str(files.client_both))
    relay = await start_relay(
        make_config({"crm": crm}, ROUTES), background=False, clock=FakeClock()
    )
    refused = await post_order(relay)
    await relay.scheduler.drain()
    assert (await detail(relay, refused)).event.deliveries[0].status.value == "dead"
    renewed = files.ca.issue_cert("relay@shop.example")
    renewed.private_key_and_cert_chain_pem.write_to_path(str(files.client_both))
    os.utime(files.client_both, ns=(1, 2))  # a different time, however fast this runs
    await relay.reload(make_config({"crm": crm}, ROUTES))
    taken = await post_order(relay)
    await relay.scheduler.drain()
    assert (await detail(relay, taken)).event.deliveries[0].status.value == "delivered"
    assert len(seen) == 1


async def test_credentials_relay_sends_are_masked_in_every_form_a_peer_quotes_back(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """user:password in a target's url goes as Basic authorization, and a
    proxy's as Proxy-Authorization: base64 of the pair. A receiver that quotes
    the request back (httpbin's /anything, many CRMs' error pages) showed it in
    the attempt's answer, where base64 is as good as clear."""

    def echo(request: web.Request, number: int) -> web.StreamResponse:
        # As httpbin's /anything answers: the request's headers, verbatim.
        return web.json_response({"error": "refused", "headers": dict(request.headers)}, status=400)

    sink, url = await start_sink(echo)
    password = "crm-p@ss:word"
    with_user = url.replace("http://", "http://crm:${CRM_PASSWORD}@")
    relay = await start_relay(
        make_config(
            {"crm": target(with_user)},
            ROUTES,
            environ={
                "CRM_PASSWORD": quote(password, safe=""),
                "HTTPS_PROXY": f"egress:{PROXY_PASSWORD}@proxy.corp:3128",
            },
        ),
        background=False,
        clock=FakeClock(),
    )
    await post_order(relay, b'{"order": 1}')
    await relay.scheduler.drain()
    [request] = sink.requests
    pair = base64.b64encode(f"crm:{password}".encode()).decode()
    assert request.headers["Authorization"] == f"Basic {pair}"
    [event] = await relay.store.list_events(EventQuery())
    found = await relay.store.get_event(event.id)
    assert found is not None
    [[attempt]] = found.attempts.values()
    assert b"Basic " in attempt.response
    assert pair.encode() not in attempt.response
    assert password.encode() not in attempt.response
    # The environment's proxy, written without a scheme as curl takes it.
    proxied = base64.b64encode(f"egress:{PROXY_PASSWORD}".encode()).decode()
    assert proxied not in relay.config.masker.text(f"Proxy-Authorization: Basic {proxied}")


def test_relay_check_warns_of_a_client_key_other_users_may_read(
    tmp_path: Path, make_config: ConfigFactory
) -> None:
    # The key lets whoever reads it pose as relay to the CRM (mutual TLS).
    files = TLSFiles(tmp_path)
    for mode, keys, warned in (
        (0o644, {"client_cert": files.client_cert, "client_key": files.client_key}, "client_key"),
        (0o640, {"client_cert": files.client_both}, "client_cert"),
        (0o600, {"client_cert": files.client_cert, "client_key": files.client_key}, None),
    ):
        for path in (files.client_key, files.client_both):
            path.chmod(mode)
        crm = target("https://crm.example/hook", **{k: str(v) for k, v in keys.items()})
        found = [w for w in warnings(make_config({"crm": crm}, ROUTES)) if "private key" in w]
        if warned is None:
            assert found == []
        else:
            [said] = found
            assert said.startswith(f"targets.crm.{warned}: ")
            assert f"is mode {mode:o}" in said
            assert "chmod 600" in said
