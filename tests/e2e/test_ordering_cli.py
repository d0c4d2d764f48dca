"""Per-key ordering as an operator meets it: a running relay, `relay show`
saying what holds a delivery back, `relay skip` letting the rest go."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from helpers import RelayProcess, Sink, arelay_cli, arelay_json, eventually, write_config

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
            shown = await arelay_json("show", str(first), "--config", str(config))
            return bool(shown["deliveries"][0]["status"] == "dead")

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
