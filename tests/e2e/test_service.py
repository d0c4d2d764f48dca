"""`relay serve` under a notify socket, reloaded with SIGHUP: valid, invalid, under load."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from pytest_aiohttp import AiohttpServer

from helpers import Received, RelayProcess, Sink, arelay_json, eventually, free_port, write_config
from unit.test_watchdog import NotifySocket


def base_config(sink_url: str, **routes: Any) -> dict[str, Any]:
    return {
        "retry": {"unit": "10ms", "max_delay": "50ms", "retries": 1000},
        "targets": {"crm": {"type": "http", "url": sink_url}},
        "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}, **routes},
    }


async def wait_message(
    notify: NotifySocket, prefix: str, after: int = 0, timeout: float = 10
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, text in notify.messages[after:]:
            if text.startswith(prefix):
                return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {prefix!r} in {[t for _, t in notify.messages]}")


async def post(http: aiohttp.ClientSession, url: str, key: str) -> int:
    async with http.post(url, json={"key": key}, headers={"Idempotency-Key": key}) as response:
        return response.status


def sent_key(request: Received) -> str:
    """The sender's key of a request the sink got, read from its body (the
    Idempotency-Key relay sends is each delivery's own identity)."""
    return str(json.loads(request.body)["key"])


async def test_notify_reload_and_stop(tmp_path: Path, aiohttp_server: AiohttpServer) -> None:
    sink = Sink(script=[200])
    sink_url = str((await aiohttp_server(sink.app())).make_url("/hook"))
    path = write_config(tmp_path / "relay.toml", base_config(sink_url))
    notify = NotifySocket()
    relay = RelayProcess(
        path, tmp_path / "relay.log", env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"}
    )
    try:
        relay.start()
        ready = await wait_message(notify, "READY=1")
        assert "STATUS=pending 0, dead 0" in ready
        async with aiohttp.ClientSession() as http:
            assert await post(http, f"{relay.url}/hooks/orders", "before") == 200
            await eventually(lambda: _true(len(notify.pings()) >= 3), timeout=5)

            # A valid change: a new route, live without a restart.
            write_config(
                path, base_config(sink_url, leads={"path": "/hooks/leads", "targets": ["crm"]})
            )
            seen = len(notify.messages)
            relay.process.send_signal(signal.SIGHUP)
            assert (await wait_message(notify, "RELOADING=1", seen)).startswith("RELOADING=1")
            await wait_message(notify, "READY=1", seen)
            assert await post(http, f"{relay.url}/hooks/leads", "new-route") == 200
            assert await post(http, f"{relay.url}/hooks/orders", "old-route") == 200

            # An invalid one: logged with its key, the running config kept.
            write_config(
                path,
                base_config(
                    sink_url, leads={"path": "/hooks/leads", "targets": ["crm"], "lisen": 1}
                ),
            )
            seen = len(notify.messages)
            relay.process.send_signal(signal.SIGHUP)
            failed = await wait_message(notify, "READY=1", seen)
            assert "reload failed" in failed
            assert "routes.leads.lisen" in failed
            assert await post(http, f"{relay.url}/hooks/leads", "still-there") == 200

            async def delivered() -> bool:
                return len(sink.requests) == 4

            await eventually(delivered)
        seen = len(notify.messages)
        assert await relay.astop() == 0
        await wait_message(notify, "STOPPING=1", seen)
    finally:
        await relay.astop()
        notify.close()
    log = relay.log()
    assert (
        "reload failed, still running the previous config: routes.leads.lisen: unknown key" in log
    )
    assert {sent_key(r) for r in sink.requests} == {
        "before",
        "new-route",
        "old-route",
        "still-there",
    }


async def _true(value: bool) -> bool:
    return value


async def test_reload_under_load_loses_nothing_and_repeats_nothing(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    sink = Sink(script=[200])
    sink_url = str((await aiohttp_server(sink.app())).make_url("/hook"))
    path = write_config(tmp_path / "relay.toml", base_config(sink_url))
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    acked: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def sender() -> None:
                for i in range(300):
                    key = f"k{i}"
                    if await post(http, f"{relay.url}/hooks/orders", key) == 200:
                        acked.append(key)

            sending = asyncio.create_task(sender())
            for round_number in range(6):
                await asyncio.sleep(0.05)
                if round_number % 2:
                    path.write_text(path.read_text() + "\n[bogus]\n")  # invalid
                else:
                    write_config(
                        path,
                        base_config(
                            sink_url,
                            **{
                                f"r{round_number}": {
                                    "path": f"/hooks/r{round_number}",
                                    "targets": ["crm"],
                                }
                            },
                        ),
                    )
                relay.process.send_signal(signal.SIGHUP)
            await sending

            async def all_delivered() -> bool:
                return len({sent_key(r) for r in sink.requests}) >= len(acked)

            await eventually(all_delivered, timeout=20)
    finally:
        await relay.astop()
    assert len(acked) == 300
    counts = Counter(sent_key(r) for r in sink.requests)
    assert set(counts) == set(acked)
    assert max(counts.values()) == 1  # the reloads themselves sent nothing twice
    assert relay.log().count("reload failed") == 3


async def test_a_removed_target_keeps_its_deliveries_until_it_returns(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    down = f"http://127.0.0.1:{free_port()}/hook"
    config = {
        "retry": {"unit": "10ms", "max_delay": "50ms", "retries": 1000},
        "targets": {
            "crm": {"type": "http", "url": down},
            "audit": {"type": "file", "path": "audit.jsonl"},
        },
        "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm", "audit"]}},
    }
    path = write_config(tmp_path / "relay.toml", config)
    relay = RelayProcess(path, tmp_path / "relay.log").start()
    try:
        async with aiohttp.ClientSession() as http:
            assert await post(http, f"{relay.url}/hooks/orders", "order-1") == 200
        write_config(
            path,
            {
                **config,
                "targets": {"audit": config["targets"]["audit"]},
                "routes": {"orders": {"path": "/hooks/orders", "targets": ["audit"]}},
            },
        )
        relay.process.send_signal(signal.SIGHUP)

        async def kept() -> bool:
            [event] = await arelay_json("events", "--config", str(path))
            crm = next(d for d in event["deliveries"] if d["target"] == "crm")
            return crm["status"] == "pending" and "not configured" in (crm["last_error"] or "")

        await eventually(kept, timeout=10)
        sink = Sink(script=[200])
        sink_url = str((await aiohttp_server(sink.app())).make_url("/hook"))
        write_config(
            path,
            {**config, "targets": {**config["targets"], "crm": {"type": "http", "url": sink_url}}},
        )
        relay.process.send_signal(signal.SIGHUP)
        await sink.wait_for(1)
    finally:
        await relay.astop()
    assert sent_key(sink.requests[0]) == "order-1"
