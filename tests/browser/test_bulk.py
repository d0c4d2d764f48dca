"""Bulk actions on the Dead letter page take exactly what the page shows
(its search included), say how many before acting, and skip asks first."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from playwright.async_api import Browser, expect
from test_dashboard import TOKEN, browser, shot, sign_in

from relay.app import Relay
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture, shared with test_dashboard


async def _statuses(relay: Relay) -> dict[int, Status]:
    events = await relay.store.list_events(EventQuery(route="leads", limit=100))
    return {event.id: event.deliveries[0].status for event in events}


async def test_a_filtered_bulk_requeue_takes_the_shown_events_and_skip_takes_the_ticked(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    # The CRM refuses every lead at first (a wrong field mapping): all dead.
    crm, crm_url = await start_sink([422])
    config = make_config(
        {"crm": {"type": "http", "url": crm_url, "retry": {"retries": 0}}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    phones = ["+7 999 123-45-67", "+7 912 000-00-01", "8 999 123 45 67", "+7 913 000-00-02"]
    async with aiohttp.ClientSession() as http:
        for phone in [*phones, "+7 914 000-00-03"]:
            async with http.post(
                relay.ingress_url + "/hooks/leads", json={"name": "Anna", "phone": phone}
            ) as answer:
                assert answer.status == 200
    for _ in range(100):
        if list((await _statuses(relay)).values()) == [Status.DEAD] * 5:
            break
        await asyncio.sleep(0.05)
    await relay.indexer.catch_up()

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    await page.goto(relay.admin_url + "/dead")
    await page.get_by_label("Search").fill("79991234567")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("table.events tbody tr")).to_have_count(2)
    await expect(page.locator("#bulk-count")).to_contain_text("2 dead deliveries match this search")
    await page.get_by_role("button", name="Requeue them…").click()
    await expect(page.locator("p.confirm")).to_contain_text("This will requeue 2 dead deliveries")
    await shot(page, "bulk-requeue-confirm")
    crm.script = [200]  # the mapping fixed
    await page.get_by_role("button", name="Requeue 2").click()
    await expect(page.locator(".flash")).to_contain_text("Requeued 2")
    for _ in range(100):
        if list((await _statuses(relay)).values()).count(Status.DELIVERED) == 2:
            break
        await asyncio.sleep(0.05)
    statuses = await _statuses(relay)
    assert sorted(statuses.values()) == sorted([Status.DELIVERED] * 2 + [Status.DEAD] * 3)
    assert [statuses[1], statuses[3]] == [Status.DELIVERED, Status.DELIVERED]

    # A batch of test payments: tick two, skip them, after saying so.
    await page.goto(relay.admin_url + "/dead")
    await expect(page.locator("#bulk-count")).to_contain_text("3 dead deliveries match in all")
    await page.get_by_label("select delivery 2").check()
    await page.get_by_label("select delivery 4").check()
    await page.get_by_role("button", name="Skip them…").click()
    await expect(page.locator("p.confirm")).to_contain_text(
        "This will skip 2 dead deliveries (the ones you ticked)"
    )
    await shot(page, "bulk-skip-confirm")
    assert (await _statuses(relay))[2] is Status.DEAD  # asking changed nothing
    await page.get_by_role("button", name="Skip 2").click()
    await expect(page.locator(".flash")).to_contain_text("Skipped 2")
    statuses = await _statuses(relay)
    assert [statuses[n] for n in (2, 4, 5)] == [Status.SKIPPED, Status.SKIPPED, Status.DEAD]

    # Who did what: the Audit page, and each touched delivery's history.
    await page.get_by_role("link", name="Audit", exact=True).click()
    rows = page.locator("tr.audit-entry")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("skip")
    await expect(rows.nth(0)).to_contain_text("dashboard session")
    await expect(rows.nth(1)).to_contain_text("requeue")
    await expect(rows.nth(1)).to_contain_text("dead, ids 1 3")  # exactly those confirmed
    await shot(page, "audit")
    await rows.nth(0).get_by_role("link", name="2").click()
    await expect(page.locator("ul.history")).to_contain_text("by dashboard session")
    # Each attempt shows the request it sent beside the answer.
    sent = page.locator("tr.attempt td.sent details").first
    await sent.locator("summary").click()
    await expect(sent.locator("pre")).to_contain_text("POST http://127.0.0.1")
    await expect(sent.locator("pre")).to_contain_text('"phone": "+7 912 000-00-01"')
    await shot(page, "attempt-request")
