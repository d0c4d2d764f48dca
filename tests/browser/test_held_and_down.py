"""The dashboard shows what holds a delivery back (ordering, a target down)
and skips a delivery only after asking."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from playwright.async_api import Browser, expect
from test_dashboard import TOKEN, browser, shot, sign_in

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import free_port

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture, shared with test_dashboard


async def test_held_behind_a_dead_one_skip_with_confirmation_and_a_down_target(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # The CRM refuses the first status of the order; the ERP is unreachable.
    crm, crm_url = await start_sink([422, 200])
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url},
            "erp": {
                "type": "http",
                "url": f"http://127.0.0.1:{free_port()}/erp",
                "hold_when_down": True,
                "down_after": 1,
                "retry": {"unit": "1s"},
            },
        },
        {
            "tbank": {
                "path": "/hooks/tbank",
                "targets": [{"target": "crm", "order_by": "{{ json.OrderId }}"}, "erp"],
            }
        },
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    async with aiohttp.ClientSession() as http:
        for status in ("AUTHORIZED", "CONFIRMED"):
            body = {"OrderId": "A-1", "Status": status}
            async with http.post(relay.ingress_url + "/hooks/tbank", json=body) as answer:
                assert answer.status == 200
    await crm.wait_for(1)
    for _ in range(50):
        if "erp" in relay.scheduler.down:
            break
        await asyncio.sleep(0.1)

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    await page.goto(relay.admin_url + "/events/2")
    crm_card = page.locator("article.delivery-card", has_text="crm")
    await expect(crm_card.locator("p.held")).to_contain_text("Held behind delivery 1, dead")
    await expect(crm_card.get_by_role("button", name="Retry now")).to_have_count(0)
    erp_card = page.locator("article.delivery-card", has_text="erp")
    await expect(erp_card.locator("p.held")).to_contain_text("target erp is down")
    await shot(page, "held-behind")

    await page.goto(relay.admin_url + "/events/2")
    await page.get_by_role("link", name="delivery 1").click()
    await page.wait_for_url("**/events/1#delivery-1")
    await crm_card.get_by_role("button", name="Skip…").click()
    await expect(page.locator("p.confirm")).to_contain_text("will never be sent")
    await shot(page, "skip-confirm")
    assert len(crm.requests) == 1  # asking changed nothing yet
    await page.get_by_role("button", name="Skip delivery 1").click()
    await expect(page.locator(".flash")).to_contain_text("Delivery 1 is skipped")
    await expect(crm_card.locator("h3 .status")).to_have_text("skipped")
    await expect(crm_card.locator("ul.history")).to_contain_text("skip — not to be sent (was dead)")
    await crm.wait_for(2)  # the CONFIRMED behind it went

    await page.get_by_role("link", name="Targets", exact=True).click()
    await expect(page.locator("#target-erp h2 .status")).to_have_text("down")
    await expect(page.locator("#down-erp")).to_contain_text("spending no retries")
    await shot(page, "target-down")

    # Which delivery probes, linked; its page says it is the next probe.
    await expect(page.locator("#down-erp a.probe")).to_have_text(re.compile(r"delivery \d+"))
    # (Paused meanwhile: no probe moves the line while the page is read.)
    await relay.console.set_paused("erp", True, by="test")
    await page.reload()
    await page.locator("#down-erp a.probe").click()
    await expect(page.locator("p.probing")).to_contain_text("this delivery is its next probe")
    await relay.console.set_paused("erp", False, by="test")
    await page.go_back()
    # A probe's attempt says it was one.
    for _ in range(100):
        if (await relay.store.down_targets())["erp"].probes >= 1:
            break
        await asyncio.sleep(0.1)
    await page.reload()
    last_probe = page.locator("#down-erp a").last
    await expect(last_probe).to_have_text(re.compile(r"delivery \d+"))
    await last_probe.click()
    await page.wait_for_url(re.compile(r".*/events/\d+#delivery-\d+"))
    await expect(page.locator("tr.attempt-probe").first).to_contain_text("probe")
    await shot(page, "probe-attempt")
