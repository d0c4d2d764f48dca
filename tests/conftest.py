from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

sys.path.insert(0, str(Path(__file__).parent))

from relay.app import Relay
from relay.config import Config, parse_config

from helpers import Sink

ConfigFactory = Callable[..., Config]


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
    """A Config from plain dicts: ingress on a free port, database in tmp_path."""

    def make(
        targets: dict[str, Any],
        routes: dict[str, Any],
        *,
        retry: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        storage: dict[str, Any] | None = None,
        admin: dict[str, Any] | None = None,
        alerts: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> Config:
        data = {
            "server": {"listen": "127.0.0.1:0", "shutdown_timeout": "5s", **(server or {})},
            "storage": {"path": "relay.db", **(storage or {})},
            "admin": {"listen": "127.0.0.1:0", **(admin or {})},
            "retry": {"jitter": 0, **(retry or {})},
            "targets": targets,
            "routes": routes,
        }
        if alerts:
            data["alerts"] = alerts
        return parse_config(data, environ or {}, base=tmp_path)

    return make


SinkFactory = Callable[..., Awaitable[tuple[Sink, str]]]


@pytest.fixture
def start_sink(aiohttp_server: AiohttpServer) -> SinkFactory:
    """Start a recording target on 127.0.0.1; returns it and its URL."""

    async def start(script: Any = None, path: str = "/hook") -> tuple[Sink, str]:
        sink = Sink() if script is None else Sink(script=script)
        server = await aiohttp_server(sink.app())
        return sink, str(server.make_url(path))

    return start


RelayFactory = Callable[..., Awaitable[Relay]]


@pytest.fixture
async def start_relay() -> AsyncIterator[RelayFactory]:
    """Start relays in this process; each is stopped at the end of the test."""
    started: list[Relay] = []

    async def start(config: Config, *, background: bool = True, **kwargs: Any) -> Relay:
        relay = Relay(config, **kwargs)
        await relay.start(background=background)
        started.append(relay)
        return relay

    yield start
    for relay in reversed(started):
        await relay.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
