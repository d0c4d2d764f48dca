"""`relay serve` as a user runs it: a subprocess, real HTTP, the CLI reading its database."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_cli, arelay_json, eventually, write_config


async def start(aiohttp_server: AiohttpServer, script: Any) -> tuple[Sink, str]:
    sink = Sink(script=script)
    server = await aiohttp_server(sink.app())
    return sink, str(server.make_url("/hook"))


async def test_short_schedule_end_to_end(tmp_path: Path, aiohttp_server: AiohttpServer) -> None:
    always_400, url_400 = await start(aiohttp_server, [400])
    always_503, url_503 = await start(aiohttp_server, [503])
    flaky, url_flaky = await start(aiohttp_server, [500, 500, 500, 200])

    def redirect(request: web.Request, number: int) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": "/moved"})

    redirecting, url_302 = await start(aiohttp_server, redirect)
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0", "max_body_size": "4KiB"},
            "storage": {"path": "relay.db"},
            "retry": {"unit": "1ms", "retries": 5, "jitter": 0},
            "targets": {
                "bad": {"type": "http", "url": url_400},
                "down": {"type": "http", "url": url_503},
                "moved": {"type": "http", "url": url_302},
                "flaky": {"type": "http", "url": url_flaky},
                "audit": {"type": "file", "path": "audit.jsonl"},
            },
            "routes": {
                "r400": {"path": "/hooks/400", "targets": ["bad"]},
                "r503": {"path": "/hooks/503", "targets": ["down"]},
                "r302": {"path": "/hooks/302", "targets": ["moved"]},
                "fan": {"path": "/hooks/fan", "targets": ["flaky", "audit"]},
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    try:
        ids: dict[str, str] = {}
        async with aiohttp.ClientSession() as http:
            for name in ("400", "503", "302", "fan"):
                async with http.post(
                    f"{relay.url}/hooks/{name}",
                    json={"route": name},
                    headers={"Idempotency-Key": f"key-{name}"},
                ) as response:
                    assert response.status == 200
                    ids[name] = (await response.json())["id"]
            async with http.post(
                f"{relay.url}/hooks/fan",
                json={"route": "fan"},
                headers={"Idempotency-Key": "key-fan"},
            ) as response:
                assert await response.json() == {"status": "duplicate", "id": ids["fan"]}
            async with http.post(f"{relay.url}/hooks/fan", data=b"x" * 5000) as response:
                assert response.status == 413
            async with http.post(f"{relay.url}/hooks/none", data=b"{}") as response:
                assert response.status == 404

        async def settled() -> list[dict[str, Any]]:
            return await arelay_json("events", "--config", str(config))

        async def all_final() -> bool:
            return all(e["status"] in ("delivered", "dead") for e in await settled())

        await eventually(all_final, timeout=20)
        events = {e["id"]: e for e in await settled()}
        assert len(events) == 4
        attempts = {name: events[ids[name]]["deliveries"] for name in ids}
        assert [(d["status"], d["attempts"]) for d in attempts["400"]] == [("dead", 1)]
        assert [(d["status"], d["attempts"]) for d in attempts["302"]] == [("dead", 1)]
        assert [(d["status"], d["attempts"]) for d in attempts["503"]] == [("dead", 6)]
        assert sorted((d["target"], d["status"], d["attempts"]) for d in attempts["fan"]) == [
            ("audit", "delivered", 1),
            ("flaky", "delivered", 4),
        ]
        assert len(always_400.requests) == 1
        assert len(redirecting.requests) == 1
        assert len(always_503.requests) == 6
        assert len(flaky.requests) == 4
        assert events[ids["fan"]]["idempotency_key"] == "key-fan"
        assert set(events[ids["fan"]]) == {
            "id",
            "route",
            "idempotency_key",
            "key_conflict_of",
            "flagged",
            "received_at",
            "status",
            "deliveries",
            "who",  # whom it is about, at a glance (relay.ops.glance)
            "snippet",
        }
        assert set(attempts["fan"][0]) == {
            "id",
            "target",
            "status",
            "attempts",
            "attempts_in_cycle",
            "next_attempt_at",
            "last_error",
            "resolved_by",
            "resolves",
        }

        shown = await arelay_json("show", ids["503"], "--config", str(config))
        assert json.loads(shown["body"]) == {"route": "503"}
        [delivery] = shown["deliveries"]
        assert [a["http_status"] for a in delivery["attempts_log"]] == [503] * 6
        assert [a["number"] for a in delivery["attempts_log"]] == [1, 2, 3, 4, 5, 6]
        assert delivery["last_error"].startswith("HTTP 503")

        dead_only = await arelay_json("events", "--status", "dead", "--config", str(config))
        assert {e["route"] for e in dead_only} == {"r400", "r503", "r302"}
        assert "attempt=6/6" in relay.log()
        text = (await arelay_cli("events", "--config", str(config))).stdout
        assert re.search(r"flaky#\d+:delivered\(4\)", text), text  # its id, for relay retry
    finally:
        assert await relay.astop() == 0
    assert "stopped" in relay.log()


async def test_sigterm_finishes_the_attempt_in_flight(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    async def slow(request: web.Request, number: int) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        return web.Response(status=200)

    sink, url = await start(aiohttp_server, slow)
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0", "shutdown_timeout": "10s"},
            "targets": {"crm": {"type": "http", "url": url}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{relay.url}/hooks/orders", data=b"{}") as response,
    ):
        assert response.status == 200
    await sink.wait_for(1)
    code = await asyncio.get_running_loop().run_in_executor(None, relay.kill, signal.SIGTERM)
    assert code == 0
    [event] = await arelay_json("events", "--config", str(config))
    assert event["status"] == "delivered"
