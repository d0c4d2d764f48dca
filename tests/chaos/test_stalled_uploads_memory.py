"""Memory held by stalled uploads is given back once they are gone, even while
webhooks keep coming.

Before: 300 stalled uploads raised RSS 47 -> 114 MiB, and it was given back
only after 10 s with no webhook and no attempt at all: a busy relay kept it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from figures import record_figures
from helpers import RelayProcess, orders_config

pytestmark = pytest.mark.chaos

STALLED = 300


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_stalled_uploads_memory_comes_back_while_webhooks_keep_coming(
    tmp_path: Path,
) -> None:
    config = orders_config(tmp_path / "relay.toml", server={"read_timeout": "1s"})
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    assert relay.process is not None
    pid = relay.process.pid
    host, port = relay.url.removeprefix("http://").split(":")
    writers = []
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(relay.url + "/orders", data=b"{}") as answer:
                assert answer.status == 200
            before = rss_mib(pid)
            for number in range(STALLED):
                # From two addresses: one holds at most half the bodies' bound,
                # and the test is of the whole of it.
                source = ("127.0.0.2", 0) if number % 2 else None
                _, writer = await asyncio.open_connection(host, int(port), local_addr=source)
                head = b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
                writer.write(head + b"x" * (900 * 1024))  # and the rest never comes
                writers.append(writer)
            await asyncio.sleep(0.8)
            held = rss_mib(pid)
            # Never quiet: a webhook every 0.2 s while the uploads time out
            # (408). While they hold the bodies' bound, a webhook is told to
            # come back (503 and Retry-After), never answered 200 unstored.
            started = time.monotonic()
            after = held
            stored = 0
            while time.monotonic() - started < 12:
                async with http.post(relay.url + "/orders", data=b"{}") as answer:
                    assert answer.status in (200, 503)
                    if answer.status == 503:
                        assert answer.headers["Retry-After"]
                    stored += answer.status == 200
                await asyncio.sleep(0.2)
                after = rss_mib(pid)
                if after < before + 16 and stored:
                    break
    finally:
        for writer in writers:
            writer.close()
        assert await relay.astop() == 0
    record_figures(
        "stalled_uploads_memory",
        {
            "rss_before_mib": round(before, 1),
            "rss_stalled_mib": round(held, 1),
            "rss_after_mib": round(after, 1),
            "seconds_to_give_back": round(time.monotonic() - started, 1),
        },
    )
    assert held > before + 32  # the uploads did hold memory
    assert after < before + 16
