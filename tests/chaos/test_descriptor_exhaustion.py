"""Idle sockets under a small descriptor limit: relay keeps serving webhooks and /healthz.

Before: with `ulimit -n 256`, 400 idle sockets used up every descriptor;
legitimate webhooks failed, /healthz was unreachable and SQLite answered
"unable to open database file" (503). Now each listener has a connection cap
taken from the limit, and past it the quietest connection makes room.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from figures import record_figures
from helpers import RelayProcess, orders_config

pytestmark = pytest.mark.chaos

IDLE_SOCKETS = 400


def open_idle(url: str, count: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(count):
        connection = socket.socket()
        connection.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            connection.connect((host, int(port)))
        sockets.append(connection)
    return sockets


async def test_idle_sockets_do_not_starve_webhooks_or_healthz(tmp_path: Path) -> None:
    config = orders_config(tmp_path / "relay.toml")
    relay = RelayProcess(config, tmp_path / "relay.log", max_open_files=256).start()
    idle: list[socket.socket] = []
    try:
        idle += open_idle(relay.url, IDLE_SOCKETS)
        idle += open_idle(relay.admin_url, IDLE_SOCKETS // 4)
        await asyncio.sleep(1.5)  # accepted, and quiet for longer than QUIET_SECONDS
        statuses = []
        started = time.monotonic()
        async with aiohttp.ClientSession() as http:
            for number in range(20):
                async with http.post(relay.url + "/orders", data=b'{"n": %d}' % number) as answer:
                    statuses.append(answer.status)
                async with http.get(relay.admin_url + "/healthz") as answer:
                    statuses.append(answer.status)
                async with http.get(relay.admin_url + "/readyz") as answer:
                    statuses.append(answer.status)
        elapsed = time.monotonic() - started
        record_figures(
            "descriptor_exhaustion",
            {
                "ulimit_n": 256,
                "idle_sockets": len(idle),
                "requests": len(statuses),
                "seconds": round(elapsed, 2),
            },
        )
        assert statuses == [200] * len(statuses)
        assert "Too many open files" not in relay.log()
    finally:
        for connection in idle:
            connection.close()
        assert await relay.astop() == 0
