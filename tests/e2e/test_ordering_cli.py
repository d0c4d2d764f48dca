"""Per-key ordering as an operator meets it: a running relay, `relay show`
saying what holds a delivery back, `relay skip` letting the rest go."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_cli, eventually, write_config

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tbank" / "notification-confirmed.json"


async def test_a_dead_status_holds_the_next_until_relay_skip(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    def crm_answer(request: web.Request, number: int) -> web.StreamResponse:
        # The CRM cannot take this order's AUTHORIZED (a field it refuses).
        return web.Response(status=422 if number == 0 else 200)

    crm = Sink(script=crm_answer)
    server = await aiohttp_server(crm.app())
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "retry": {"unit": "1ms", "retries": 2, "jitter": 0},
            "targets": {"crm": {"type": "http", "url": str(server.make_url("/crm"))}},
            "routes": {
                "tbank": {
                    "path": "/hooks/tbank",
                    "targets": [{"target": "crm", "order_by": "{{ json.OrderId }}"}],
                }
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    try:
        base = json.loads(FIXTURE.read_text())
        ids = []
        async with aiohttp.ClientSession() as http:
            for status in ("AUTHORIZED", "CONFIRMED", "REFUNDED"):
                body = {**base, "Status": status}
                async with http.post(f"{relay.url}/hooks/tbank", json=body) as answer:
                    assert answer.status == 200
                    ids.append(int((await answer.json())["id"]))
        first, second, third = ids  # one delivery per event: the same ids

        async def first_dead() -> bool:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{relay.admin_url}/api/v1/events/{first}") as answer,
            ):
                return bool((await answer.json())["deliveries"][0]["status"] == "dead")

        await eventually(first_dead, timeout=20)
        shown = await arelay_cli("show", str(second), "--config", str(config))
        assert f"held behind delivery {first}, dead" in shown.stdout
        refused = await arelay_cli("retry", str(third), "--config", str(config), check=False)
        assert refused.returncode == 2  # a CommandError
        assert f"behind delivery {first}" in refused.stderr
        assert len(crm.requests) == 1  # nothing overtook the dead one

        skipped = await arelay_cli("skip", str(first), "--config", str(config))
        assert f"delivery {first} → crm: skipped" in skipped.stdout
        await crm.wait_for(3)
        statuses = [json.loads(r.body)["Status"] for r in crm.requests]
        assert statuses == ["AUTHORIZED", "CONFIRMED", "REFUNDED"]
        again = await arelay_cli("skip", str(first), "--config", str(config), check=False)
        assert again.returncode == 2
        assert f"delivery {first} is skipped" in again.stderr
    finally:
        relay.stop()


async def test_kill_9_mid_attempt_does_not_let_the_next_status_overtake(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    # The CRM takes its time with the first request (relay is killed meanwhile),
    # then answers at once.
    release = asyncio.Event()

    async def crm_answer(request: web.Request, number: int) -> web.StreamResponse:
        if number == 0:
            await release.wait()
        return web.Response(status=200)

    crm = Sink(script=crm_answer)
    server = await aiohttp_server(crm.app())
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "retry": {"unit": "10ms", "jitter": 0},
            "targets": {"crm": {"type": "http", "url": str(server.make_url("/crm"))}},
            "routes": {
                "tbank": {
                    "path": "/hooks/tbank",
                    "targets": [{"target": "crm", "order_by": "{{ json.OrderId }}"}],
                }
            },
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    base = json.loads(FIXTURE.read_text())
    try:
        async with aiohttp.ClientSession() as http:
            for status in ("AUTHORIZED", "CONFIRMED"):
                body = {**base, "Status": status}
                async with http.post(f"{relay.url}/hooks/tbank", json=body) as answer:
                    assert answer.status == 200
        await crm.wait_for(1)  # AUTHORIZED is in flight...
        await asyncio.get_running_loop().run_in_executor(None, relay.kill)  # ...and relay dies
        release.set()
        relay.start()  # its lease is orphaned: AUTHORIZED goes again first
        await crm.wait_for(3)
        await asyncio.sleep(0.3)  # nothing else is sent
    finally:
        relay.stop()
    statuses = [json.loads(r.body)["Status"] for r in crm.requests]
    assert statuses == ["AUTHORIZED", "AUTHORIZED", "CONFIRMED"]
