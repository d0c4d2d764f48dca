"""The Overview leads with what needs a person: what went dead since the last
look, keys held behind a dead delivery, targets down, routes failing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser, expect
from test_dashboard import TOKEN, browser, shot, sign_in

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import free_port

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture, shared with test_dashboard


async def test_the_overview_says_what_needs_a_person_with_links(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # The mapping incident: the CRM refuses every lead and one payment status
    # (a bad field), takes the rest; the ERP is unreachable.
    async def crm(request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        if "lead" in body or body.get("bad"):
            return web.Response(status=422, text='{"error": "UF_CRM_PHONE: invalid value"}')
        return web.Response(text="ok")

    sink, crm_url = await start_sink(crm)
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url, "retry": {"retries": 0}},
            "erp": {
                "type": "http",
                "url": f"http://127.0.0.1:{free_port()}/erp",
                "hold_when_down": True,
                "down_after": 1,
                "retry": {"unit": "1s"},
            },
        },
        {
            "tilda": {"path": "/hooks/tilda", "targets": ["crm"]},
            "tbank": {
                "path": "/hooks/tbank",
                "targets": [{"target": "crm", "order_by": "{{ json.OrderId }}"}],
            },
            "erp": {"path": "/hooks/erp", "targets": ["erp"]},
        },
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    posts = [
        *(("/hooks/tilda", {"lead": n}) for n in range(3)),
        ("/hooks/tbank", {"OrderId": "A-1", "Status": "AUTHORIZED", "bad": True}),
        ("/hooks/tbank", {"OrderId": "A-1", "Status": "CONFIRMED"}),
        ("/hooks/erp", {"invoice": 1}),
    ]
    async with aiohttp.ClientSession() as http:
        for path, body in posts:
            async with http.post(relay.ingress_url + path, json=body) as answer:
                assert answer.status == 200
    failing = {("tilda", "crm"), ("tbank", "crm")}
    for _ in range(100):
        # Attempts are counted into the routes' streaks within a second (COUNT_EVERY).
        if (
            (await relay.store.stats()).dead == 4
            and "erp" in relay.scheduler.down
            and failing <= set(relay.console.route_health())
        ):
            break
        await asyncio.sleep(0.05)

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    attention = page.locator("section.attention")
    await expect(attention.locator("#attention-dead")).to_contain_text("4 deliveries went dead")
    held = attention.locator("li.held-key")
    await expect(held).to_contain_text("Key A-1 to crm: 1 delivery waits behind dead delivery 4")
    await expect(attention.locator("li.target-down")).to_contain_text("Target erp is down")
    failing = attention.locator("li.route-failing")
    await expect(failing).to_have_count(2)  # the down ERP's route is the ERP's line
    await expect(failing.filter(has_text="tilda")).to_contain_text(
        "tilda → crm: 3 failed in a row; last error: HTTP 422"
    )
    await expect(failing.filter(has_text="tbank")).to_contain_text("tbank → crm: 1 failed")
    await shot(page, "overview-attention")
    await held.get_by_role("link", name="delivery 4").click()
    await page.wait_for_url("**/events/4#delivery-4")

    # Looked at Dead letter: nothing new is dead since; the rest still needs a person.
    await page.get_by_role("link", name="Dead letter", exact=True).click()
    await page.get_by_role("link", name="Overview", exact=True).click()
    await expect(attention.locator("#attention-dead")).to_have_count(0)
    await expect(attention.locator("li.held-key")).to_have_count(1)
    await expect(attention.locator("li.target-down")).to_have_count(1)
    assert len(sink.requests) == 4  # the CONFIRMED one never overtook its dead AUTHORIZED
