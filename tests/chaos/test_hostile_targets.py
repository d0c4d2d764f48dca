"""Targets that misbehave: each failure is classified as the design says, and none
can stall the scheduler (a healthy target keeps getting its deliveries) or make
relay read more than it keeps."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from relay.app import Relay
from relay.store import EventQuery, Status

from conftest import TRANSPORTS, ConfigFactory, RelayFactory, SinkFactory
from figures import record_figures
from helpers import ForwardingProxy, post_events

pytestmark = pytest.mark.chaos

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs over each HTTP transport (tests/conftest.py)."""
    value: str = request.param
    return value


class RawServer:
    """A TCP server on 127.0.0.1 that does whatever `behaviour` does with a connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sent = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.behaviour(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def read_request(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(3600)


async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST, not FIN


async def slow_loris(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(100000):
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.05)


def huge(server: RawServer) -> Behaviour:
    async def behaviour(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        size = 200 * 1024 * 1024
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"y" * 65536
        for _ in range(size // len(chunk)):
            writer.write(chunk)
            await writer.drain()
            server.sent += len(chunk)

    return behaviour


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"THIS IS NOT HTTP\r\n\x00\x01\x02\r\n\r\n")
    await writer.drain()


async def plain_tcp_for_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(1024)  # a TLS hello: answer with plain text
    writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    await writer.drain()


@pytest.fixture
async def servers() -> AsyncIterator[list[RawServer]]:
    started: list[RawServer] = []
    yield started
    for server in started:
        await server.close()


async def start(
    servers: list[RawServer], behaviour: Behaviour | None, server: RawServer | None = None
) -> str:
    raw = server or RawServer(behaviour)  # type: ignore[arg-type]
    servers.append(raw)
    return f"127.0.0.1:{await raw.start()}"


@pytest.mark.parametrize("path", ["direct", "proxy"])
async def test_misbehaving_targets(
    path: str,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    servers: list[RawServer],
) -> None:
    """`proxy`: every target through an HTTP proxy (CONNECT for the https one),
    which passes on whatever the target does."""
    proxy = ForwardingProxy()
    via = {"proxy": await proxy.start()} if path == "proxy" else {}
    healthy, healthy_url = await start_sink([200])
    huge_server = RawServer(hang)
    huge_server.behaviour = huge(huge_server)
    hosts = {
        "hanging": f"http://{await start(servers, hang)}/",
        "resetting": f"http://{await start(servers, reset)}/",
        "slowloris": f"http://{await start(servers, slow_loris)}/",
        "garbage": f"http://{await start(servers, garbage)}/",
        "tls": f"https://{await start(servers, plain_tcp_for_tls)}/",
        "dns": "http://no-such-host.invalid/",
        "huge": f"http://{await start(servers, None, huge_server)}/",
    }
    targets: dict[str, Any] = {
        name: {
            "type": "http",
            "url": url,
            "retry": {"retries": 1, "unit": "10ms", "timeout": "1s"},
            **via,
        }
        for name, url in hosts.items()
    }
    targets["healthy"] = {"type": "http", "url": healthy_url, **via}
    config = make_config(
        targets, {"orders": {"path": "/hooks/orders", "targets": [*hosts, "healthy"]}}
    )
    relay: Relay = await start_relay(config, poll_interval=0.05)
    started = time.monotonic()
    await post_events(relay.ingress_url + "/hooks/orders", 20)
    await healthy.wait_for(20, timeout=5)
    healthy_seconds = time.monotonic() - started
    # The healthy target was served while the others hung, reset, dribbled.
    assert healthy_seconds < 3

    async def settled() -> bool:
        events = await relay.store.list_events(EventQuery(limit=100))
        return all(
            d.status in (Status.DEAD, Status.DELIVERED) for e in events for d in e.deliveries
        )

    deadline = time.monotonic() + 60
    while not await settled():
        assert time.monotonic() < deadline, "deliveries did not settle"
        await asyncio.sleep(0.2)
    events = await relay.store.list_events(EventQuery(limit=100))
    errors: dict[str, set[str]] = {}
    outcomes: dict[str, set[tuple[Status, int]]] = {}
    for event in events:
        detail = await relay.store.get_event(event.id)
        assert detail is not None
        for delivery in detail.event.deliveries:
            outcomes.setdefault(delivery.target, set()).add((delivery.status, delivery.attempts))
            for attempt in detail.attempts[delivery.id]:
                errors.setdefault(delivery.target, set()).add(attempt.error or "ok")
                assert len(attempt.response) <= 2048
    for name in ("hanging", "resetting", "garbage", "tls", "dns"):
        # Retryable: one retry allowed, so dead after 2 attempts.
        assert outcomes[name] == {(Status.DEAD, 2)}, (name, outcomes[name], errors[name])
    assert errors["hanging"] == {"timeout after 1s"}
    # It said 200 and dribbles its body: delivered on the status, with a note,
    # before the time limit (sending it again would deliver it twice).
    assert outcomes["slowloris"] == {(Status.DELIVERED, 1)}
    assert errors["slowloris"] == {"HTTP 200; its body stopped coming, kept as sent"}
    # A proxy says a name did not resolve as Squid does, 502, or its lookup
    # outlasts the attempt's half second.
    dns = ("HTTP 502", "timeout") if path == "proxy" else ("DNS",)
    assert all(e.startswith(dns) for e in errors["dns"]), errors["dns"]
    assert all("TLS" in e or "SSL" in e.upper() or "connection" in e for e in errors["tls"])
    assert all("invalid HTTP" in e or "connection" in e for e in errors["garbage"])
    assert outcomes["huge"] == {(Status.DELIVERED, 1)}
    assert outcomes["healthy"] == {(Status.DELIVERED, 1)}
    # 200 MiB offered per delivery; relay read its 2 KiB and hung up.
    assert huge_server.sent < 20 * 200 * 1024 * 1024 / 4
    await proxy.close()
    if path == "proxy":
        assert {line.split()[0] for line, _ in proxy.seen} == {"CONNECT", "POST"}
        return
    record_figures(
        "hostile_targets",
        {
            "targets": sorted(hosts),
            "deliveries_each": 20,
            "huge_response_bytes_offered": 20 * 200 * 1024 * 1024,
            "huge_response_bytes_sent_before_hang_up": huge_server.sent,
            "healthy_target_served_within_s": round(healthy_seconds, 2),
        },
    )
