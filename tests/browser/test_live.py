"""The dashboard keeps itself up to date in place: every 10 s it fetches the
page it shows and swaps the parts that change (counts, badges, the list's
rows), never reloading, so nothing a person is doing is lost — and it waits
while they type or have deliveries ticked, and while the tab is hidden.

Time in the page is Playwright's fake clock: the 10 s pass when the test says.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from playwright.async_api import Browser, Page, Request, expect
from test_dashboard import TOKEN, browser, shot, sign_in

from relay.app import Relay
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory

pytestmark = pytest.mark.browser
__all__ = ["browser"]  # the fixture, shared with test_dashboard

EVERY_MS = 10_000
START = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


async def _relay(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> Relay:
    # The CRM refuses every lead (a wrong field mapping): each goes dead at once.
    _, crm_url = await start_sink([422] * 100)
    config = make_config(
        {"crm": {"type": "http", "url": crm_url, "retry": {"retries": 0}}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    return await start_relay(config, poll_interval=0.05)


async def _lead(relay: Relay, number: int) -> None:
    """A webhook arrives, and its delivery goes dead."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/leads", json={"name": f"Lead {number}", "n": number}
        ) as answer,
    ):
        assert answer.status == 200
    for _ in range(500):
        events = await relay.store.list_events(EventQuery(status=Status.DEAD, limit=1000))
        if any(event.id == number for event in events):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"event {number} did not go dead")


async def _page_with_clock(browser: Browser, relay: Relay, height: int) -> Page:
    """A page whose clock stands still: no timer fires but by `run_for`."""
    context = await browser.new_context(viewport={"width": 1280, "height": height})
    page = await context.new_page()
    await page.clock.install(time=START)
    await page.clock.pause_at(START + timedelta(seconds=1))
    await sign_in(page, relay)
    return page


NAVIGATIONS: dict[Page, int] = {}


async def _loaded(page: Page, url: str) -> None:
    """Open `url`; mark the document, which a reload would lose, and count the
    navigations from here (the fake clock hides `performance`'s)."""
    await page.goto(url)
    await page.evaluate("window.relayTestMarker = 'still the same document'")
    if page not in NAVIGATIONS:
        page.on("framenavigated", lambda _: NAVIGATIONS.__setitem__(page, NAVIGATIONS[page] + 1))
    NAVIGATIONS[page] = 0


async def _same_document(page: Page) -> None:
    assert await page.evaluate("window.relayTestMarker") == "still the same document"
    assert NAVIGATIONS[page] == 0


async def test_the_dead_letter_list_updates_in_place_keeping_scroll_typing_and_ticks(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    relay = await _relay(make_config, start_relay, start_sink)
    for number in range(1, 11):
        await _lead(relay, number)
    page = await _page_with_clock(browser, relay, height=500)
    fetched: list[str] = []

    def note(request: Request) -> None:
        if request.resource_type == "fetch":
            fetched.append(request.url)

    page.on("request", note)
    await _loaded(page, relay.admin_url + "/dead")
    rows = page.locator("table.events tbody tr")
    await expect(rows).to_have_count(10)
    await page.evaluate("window.scrollTo(0, 180)")
    assert await page.evaluate("window.scrollY") == 180

    # A new webhook: within the interval the list shows it, counts too.
    await _lead(relay, 11)
    await page.clock.run_for(EVERY_MS)
    await expect(rows).to_have_count(11)
    await expect(rows.first).to_contain_text("#11")
    await expect(page.get_by_label("Update every 10 s")).to_be_checked()  # on by default
    await expect(page.locator("#bulk-count")).to_contain_text("11 dead deliveries match")
    await expect(page.locator("nav .badge.dead")).to_have_text("11")
    await _same_document(page)
    assert await page.evaluate("window.scrollY") == 180
    assert fetched == [relay.admin_url + "/dead"]
    await shot(page, "live-dead-updated")

    # Typing a search: nothing changes while the field has the focus...
    search = page.get_by_label("Search")
    await search.fill("Lead")
    await _lead(relay, 12)
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator("#live-state")).to_contain_text("paused")
    await expect(rows).to_have_count(11)
    # ...and when it has not, the rows change and the text typed stays.
    await page.locator("h1").click()
    await page.clock.run_for(EVERY_MS)
    await expect(rows).to_have_count(12)
    await expect(search).to_have_value("Lead")
    await _same_document(page)

    # Ticked deliveries (for a bulk action) hold the list as it is: none is lost.
    await page.get_by_label("select delivery 3").check()
    await page.locator("h1").click()
    await _lead(relay, 13)
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator("#live-state")).to_contain_text("ticked")
    await expect(rows).to_have_count(12)
    await expect(page.get_by_label("select delivery 3")).to_be_checked()
    await page.get_by_label("select delivery 3").uncheck()
    await page.locator("h1").click()
    await page.evaluate("window.scrollTo(0, 180)")  # Playwright scrolled to what it clicked
    await page.clock.run_for(EVERY_MS)
    await expect(rows).to_have_count(13)
    await expect(search).to_have_value("Lead")
    await _same_document(page)
    assert await page.evaluate("window.scrollY") == 180

    # A hidden tab asks nothing; shown again, it catches up at once.
    asked = len(fetched)
    await _visibility(page, "hidden")
    await _lead(relay, 14)
    await page.clock.run_for(3 * EVERY_MS)
    assert len(fetched) == asked
    await _visibility(page, "visible")
    await expect(rows).to_have_count(14)
    assert len(fetched) == asked + 1

    # Switched off, it stays off (remembered by this browser).
    await page.get_by_label("Update every 10 s").uncheck()
    await page.locator("h1").click()
    await _lead(relay, 15)
    await page.clock.run_for(3 * EVERY_MS)
    await expect(rows).to_have_count(14)
    assert len(fetched) == asked + 1
    await _same_document(page)


async def _visibility(page: Page, state: str) -> None:
    """What a browser does when its tab is hidden or shown again."""
    await page.evaluate(
        """state => {
            const hidden = state === "hidden";
            Object.defineProperty(document, "visibilityState", {value: state, configurable: true});
            Object.defineProperty(document, "hidden", {value: hidden, configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


async def test_the_overview_counts_update_in_place_and_the_pages_work_without_script(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    relay = await _relay(make_config, start_relay, start_sink)
    await _lead(relay, 1)
    page = await _page_with_clock(browser, relay, height=900)
    await _loaded(page, relay.admin_url + "/")
    await expect(page.locator(".tile.alarm .number")).to_have_text("1")
    await _lead(relay, 2)
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator(".tile.alarm .number")).to_have_text("2")
    await expect(page.locator("nav .badge.dead")).to_have_text("2")
    await _same_document(page)

    # Targets too: a pause made elsewhere (the CLI, another browser) shows.
    await _loaded(page, relay.admin_url + "/targets")
    await relay.console.set_paused("crm", True, by="test")
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator("#target-crm .status")).to_have_text("paused")
    await _same_document(page)
    await relay.console.set_paused("crm", False, by="test")

    # Signed out (in another tab): it stops, saying so, and keeps what it shows.
    other = await page.context.new_page()
    await other.goto(relay.admin_url + "/targets")
    await other.get_by_role("button", name="Log out").click()
    await expect(other.get_by_role("button", name="Sign in")).to_be_visible()
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator("#live-state")).to_have_text("signed out: reload the page to sign in")
    await expect(page.locator("#target-crm")).to_be_visible()
    await _same_document(page)

    # Without JavaScript: no switch that would do nothing; a reload shows what is new.
    context = await browser.new_context(java_script_enabled=False)
    plain = await context.new_page()
    await sign_in(plain, relay)
    await plain.goto(relay.admin_url + "/dead")
    await expect(plain.locator("table.events tbody tr")).to_have_count(2)
    await expect(plain.get_by_label("Update every 10 s")).to_be_hidden()
    await _lead(relay, 3)
    await plain.reload()
    await expect(plain.locator("table.events tbody tr")).to_have_count(3)
    await context.close()


async def test_an_event_page_shows_a_copy_sent_elsewhere_without_a_reload(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    """Issue 55, item 9: the event page did not update itself after a
    corrected copy was sent (from another tab, the API or the CLI)."""
    relay = await _relay(make_config, start_relay, start_sink)
    await _lead(relay, 1)
    page = await _page_with_clock(browser, relay, height=900)
    await _loaded(page, relay.admin_url + "/events/1")
    await expect(page.locator("#live-event-status")).to_contain_text("dead")
    await expect(page.locator("#resent-as")).to_have_count(0)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.admin_url + "/api/v1/events/1/resend",
            json={
                "body": '{"name": "Lead 1", "n": 1, "fixed": true}',
                "content_type": "application/json",
                "confirm": True,
            },
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as answer,
    ):
        assert answer.status == 201, await answer.text()
    await page.clock.run_for(EVERY_MS)
    await expect(page.locator("#resent-as")).to_contain_text("event #2")
    await expect(page.locator("#delivery-1")).to_contain_text("superseded")
    await _same_document(page)
