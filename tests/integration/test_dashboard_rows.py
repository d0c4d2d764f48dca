"""What a listing's row says of each delivery: why a dead one is dead, why a
pending one waits (the rows showed the status alone; the reason was one click
away on each event's page)."""

from __future__ import annotations

import aiohttp

from relay.core.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory


async def test_dead_letter_and_deliveries_rows_say_why(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # RetailCRM-like refusal of a field: the answer names it.
    _, url = await start_sink([422])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with aiohttp.ClientSession() as http:
        async with http.post(relay.ingress_url + "/hooks/leads", json={"n": 1}) as answer:
            assert answer.status == 200
        await relay.scheduler.drain()
        for path in ("/dead", "/deliveries"):
            async with http.get(relay.admin_url + path) as page:
                text = await page.text()
            assert 'class="reason"' in text, path
            assert "HTTP 422" in text, path
