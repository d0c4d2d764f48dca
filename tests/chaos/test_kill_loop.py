"""kill -9, over and over, under load, with slow, failing and flapping targets.

At the end every acknowledged event is in the database and was delivered to
every target at least once; duplicates are counted and must stay below the
number of deliveries that were in flight when relay was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from figures import record_figures
from helpers import RelayProcess, Sink, eventually, relay_json, write_config

pytestmark = pytest.mark.chaos

KILLS = 22
TARGETS = ("slow", "failing", "flapping")


class Mood:
    """How the targets behave: changed by the test as it goes."""

    def __init__(self) -> None:
        self.healthy = False
        self.flap_started = time.monotonic()

    def flapping_down(self) -> bool:
        return not self.healthy and int(time.monotonic() - self.flap_started) % 4 >= 2


async def test_kill_9_loop_under_load(tmp_path: Path, aiohttp_server: AiohttpServer) -> None:
    mood = Mood()
    rng = random.Random(20261201)
    # Event ids each target answered 2xx for: what it has really applied.
    applied: dict[str, list[str]] = {name: [] for name in TARGETS}

    def ok(name: str, request: web.Request) -> web.StreamResponse:
        applied[name].append(request.headers["X-Relay-Event-Id"])
        return web.Response(status=200)

    async def slow(request: web.Request, number: int) -> web.StreamResponse:
        await asyncio.sleep(0 if mood.healthy else rng.uniform(0.02, 0.2))
        return ok("slow", request)

    def failing(request: web.Request, number: int) -> web.StreamResponse:
        if not mood.healthy and rng.random() < 0.7:
            return web.Response(status=503)
        return ok("failing", request)

    def flapping(request: web.Request, number: int) -> web.StreamResponse:
        if mood.flapping_down():
            return web.Response(status=502)
        return ok("flapping", request)

    sinks: dict[str, Sink] = {}
    urls: dict[str, str] = {}
    for name, script in (("slow", slow), ("failing", failing), ("flapping", flapping)):
        sinks[name] = Sink(script=script)
        urls[name] = str((await aiohttp_server(sinks[name].app())).make_url("/hook"))
    config = write_config(
        tmp_path / "relay.toml",
        {
            "retry": {"unit": "10ms", "max_delay": "200ms", "retries": 1000},
            "targets": {
                name: {"type": "http", "url": url, "concurrency": 8} for name, url in urls.items()
            },
            "routes": {"orders": {"path": "/hooks/orders", "targets": list(TARGETS)}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log")
    await asyncio.to_thread(relay.start)
    acked: dict[str, str] = {}
    sent = 0
    stop_sending = asyncio.Event()
    url_box = {"url": relay.url}

    async def sender() -> None:
        nonlocal sent
        connector = aiohttp.TCPConnector(limit=16)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one(key: str) -> None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.post(
                        f"{url_box['url']}/hooks/orders",
                        json={"key": key},
                        headers={"Idempotency-Key": key},
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as response:
                        if response.status == 200:
                            acked[key] = (await response.json())["id"]

            pending: set[asyncio.Task[None]] = set()
            while not stop_sending.is_set():
                sent += 1
                task = asyncio.create_task(one(f"key-{sent}"))
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(0.004)  # ~250 webhooks a second offered
            await asyncio.gather(*pending)

    started = time.monotonic()
    sending = asyncio.create_task(sender())
    for _ in range(KILLS):
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        await asyncio.to_thread(relay.kill)  # SIGKILL at a random moment
        await asyncio.to_thread(relay.start)
        url_box["url"] = relay.url
    load_seconds = time.monotonic() - started
    stop_sending.set()
    await sending
    mood.healthy = True
    try:
        wanted = set(acked.values())

        async def all_delivered() -> bool:
            return all(wanted <= set(applied[name]) for name in TARGETS)

        await eventually(all_delivered, timeout=120)
    finally:
        await relay.astop()

    log = relay.log()
    in_flight_at_kills = sum(
        int(n) for n in re.findall(r"(\d+) deliveries were in flight when relay last stopped", log)
    )
    duplicates = 0
    for name in TARGETS:
        counts = Counter(applied[name])
        duplicates += sum(count - 1 for count in counts.values())
    stored = {
        e["idempotency_key"]: e["id"]
        for e in await asyncio.to_thread(
            relay_json, "events", "--limit", "100000", "--config", str(config)
        )
    }
    missing = [key for key, event_id in acked.items() if stored.get(key) != event_id]
    record_figures(
        "kill_loop",
        {
            "kills": KILLS,
            "load_offered_per_s": round(sent / load_seconds),
            "load_acked_per_s": round(len(acked) / load_seconds),
            "acknowledged": len(acked),
            "stored_and_delivered_to_all_targets": len(acked) - len(missing),
            "duplicate_deliveries": duplicates,
            "in_flight_at_kills": in_flight_at_kills,
        },
    )
    assert missing == []
    assert len(acked) > 1000
    assert duplicates <= in_flight_at_kills
