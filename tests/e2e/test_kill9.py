"""kill -9 in the middle of a burst, with the target down: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_json, eventually, free_port, write_config
from receivers import Remembering


async def burst(
    url: str, keys: list[str], acked: dict[str, str], stop_after: int | None, killed: asyncio.Event
) -> None:
    """Post every key; record the id of each one answered 200."""
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(key: str) -> None:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.post(
                    url,
                    json={"key": key},
                    headers={"Idempotency-Key": key},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    if response.status == 200:
                        acked[key] = (await response.json())["id"]
                        if stop_after is not None and len(acked) >= stop_after:
                            killed.set()

        await asyncio.gather(*(one(key) for key in keys))


async def test_kill_9_mid_burst_loses_nothing(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    target_port = free_port()  # the target is down: nothing listens here yet
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "retry": {"unit": "10ms", "max_delay": "100ms", "retries": 1000},
            "targets": {"crm": {"type": "http", "url": f"http://127.0.0.1:{target_port}/hook"}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log")
    acked: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    for round_number in range(3):
        relay.start()
        keys = [f"r{round_number}-{i}" for i in range(400)]
        killed = asyncio.Event()
        sender = asyncio.create_task(
            burst(f"{relay.url}/hooks/orders", keys, acked, len(acked) + 100, killed)
        )
        await asyncio.wait_for(killed.wait(), 30)
        await loop.run_in_executor(None, relay.kill)  # SIGKILL mid-burst
        await sender
    assert len(acked) >= 300

    sink = Sink(script=[200])
    await aiohttp_server(sink.app(), port=target_port)  # the target comes back
    relay.start()
    try:
        wanted = set(acked.values())

        async def all_delivered() -> bool:
            return wanted <= {r.headers["X-Relay-Event-Id"] for r in sink.requests}

        await eventually(all_delivered, timeout=60)
        stored = await arelay_json("events", "--limit", "100000", "--config", str(config))
        by_key = {event["idempotency_key"]: event for event in stored}
        for key, event_id in acked.items():
            assert by_key[key]["id"] == event_id
        received = [r.headers["X-Relay-Event-Id"] for r in sink.requests]
        duplicates = len(received) - len(set(received))
        # Only attempts cut by a kill can repeat, and the target was down then.
        assert duplicates == 0
    finally:
        await relay.astop()


async def test_a_kill_between_sending_and_recording_resends_under_the_same_key(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    # The receiver processes the request; relay is killed before its answer
    # is recorded. The next relay sends the delivery again (at least once):
    # under the same key, so a receiver that remembers keys processes it once.
    receiver = Remembering()
    relay: RelayProcess | None = None

    async def kill_first(request: web.Request) -> web.StreamResponse:
        answer = await receiver.handle(request)
        if len(receiver.processed) == 1 and not receiver.acknowledged_again:
            assert relay is not None
            await asyncio.to_thread(relay.kill)  # before the answer leaves
        return answer

    server = web.Application()
    server.router.add_post("/crm", kill_first)
    url = str((await aiohttp_server(server)).make_url("/crm"))
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "targets": {"crm": {"type": "http", "url": url}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{relay.url}/hooks/orders", json={"order": 1}) as answer,
        ):
            assert answer.status == 200

        async def killed() -> bool:
            return (
                relay is not None and relay.process is not None and relay.process.poll() is not None
            )

        await eventually(killed)
        relay.start()

        async def delivered() -> bool:
            [event] = await arelay_json("events", "--config", str(config))
            return bool(event["status"] == "delivered")

        await eventually(delivered, timeout=20)
    finally:
        await relay.astop()
    assert len(receiver.processed) == 1
    assert [item.key for item in receiver.acknowledged_again] == [receiver.processed[0].key]
