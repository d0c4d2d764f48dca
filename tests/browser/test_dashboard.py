"""The dashboard in a real headless Chromium (Debian's), driven by Playwright.

Screenshots of every page land in test-artifacts/dashboard/.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from relay.app import Relay

from conftest import ConfigFactory, RelayFactory, SinkFactory

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
TOKEN = "dashboard-token-0123456789"
# Without the background-networking flags Chromium keeps trying to reach
# Google from a machine with no outbound network.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not await asyncio.to_thread(Path(CHROMIUM).exists):
        pytest.fail("Chromium is not installed (Debian: apt-get install chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        await browser.close()


@pytest.fixture
async def setup(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> tuple[Relay, Any]:
    crm, crm_url = await start_sink([422])  # refuses the lead: dead at once
    audit = {"type": "file", "path": "audit.jsonl"}
    config = make_config(
        {"crm": {"type": "http", "url": crm_url, "retry": {"retries": 0}}, "audit": audit},
        {
            "orders": {"path": "/hooks/orders", "targets": ["crm", "audit"]},
            "bot": {
                "path": "/hooks/bot",
                "targets": ["audit"],
                "source": "telegram",
                "secret_token": "tg-secret",
            },
        },
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    async with aiohttp.ClientSession() as http:
        for number in range(1, 4):
            async with http.post(
                relay.ingress_url + "/hooks/orders",
                json={"order": number, "customer": "Anna"},
                headers={"Idempotency-Key": f"order-{number}"},
            ) as response:
                assert response.status == 200
        async with http.post(
            relay.ingress_url + "/hooks/bot",
            data=b"{}",
            headers={"X-Telegram-Bot-Api-Secret-Token": "forged"},
        ) as response:
            assert response.status == 401
    await crm.wait_for(3)
    await asyncio.sleep(0.2)  # the attempts are recorded
    return relay, crm


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def sign_in(page: Page, relay: Relay) -> None:
    await page.goto(relay.admin_url + "/")
    assert page.url.startswith(relay.admin_url + "/login?next=")
    await shot(page, "login")
    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()


async def test_retry_requeue_and_pause_from_a_browser(
    browser: Browser, setup: tuple[Relay, Any]
) -> None:
    relay, crm = setup
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    await expect(page.locator(".tile.alarm .number")).to_have_text("3")  # dead, in red
    await shot(page, "overview")

    # Find a dead delivery by its key and retry it: one more attempt, still dead.
    await page.get_by_role("link", name="Deliveries", exact=True).click()
    await page.get_by_label("Search").fill("order-2")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("table.events tbody tr")).to_have_count(1)
    await shot(page, "deliveries")
    await page.locator("table.events tbody tr a").first.click()
    crm_card = page.locator("article.delivery-card", has_text="crm")
    await expect(crm_card.locator("tr.attempt")).to_have_count(1)
    await crm_card.get_by_role("button", name="Retry now").click()
    await expect(page.locator(".flash")).to_contain_text("One more attempt is queued")
    for _ in range(50):  # the running scheduler makes the attempt
        if await crm_card.locator("tr.attempt").count() == 2:
            break
        await asyncio.sleep(0.1)
        await page.reload()
    await expect(crm_card.locator("tr.attempt")).to_have_count(2)
    await expect(crm_card.locator("h3 .status")).to_have_text("dead")
    await shot(page, "event")

    # The CRM is fixed: requeue everything dead from the dead-letter page.
    crm.script = [200]
    await page.get_by_role("link", name="Dead letter", exact=True).click()
    await shot(page, "dead-letter")
    await page.get_by_role("button", name="Requeue them…").click()
    await expect(page.locator("p.confirm")).to_contain_text("This will requeue 3 dead deliveries")
    await shot(page, "requeue-confirm")
    await page.get_by_role("button", name="Requeue 3").click()
    await expect(page.locator(".flash")).to_contain_text("Requeued 3")
    for _ in range(50):
        await page.goto(relay.admin_url + "/deliveries?status=delivered")
        if await page.locator("table.events tbody tr a").count() == 3:
            break
        await asyncio.sleep(0.1)
    await expect(page.locator("table.events tbody tr a")).to_have_count(3)

    # Pause a target.
    await page.get_by_role("link", name="Targets", exact=True).click()
    await page.get_by_role("button", name="Pause crm").click()
    await expect(page.locator(".flash")).to_contain_text("Target crm is paused")
    await expect(page.locator("#target-crm .status")).to_have_text("paused")
    assert "crm" in relay.scheduler.paused or await _eventually_paused(relay)
    await shot(page, "targets")

    await page.get_by_role("link", name="Rejections").click()
    rows = page.locator("main > .scroll > table > tbody")
    await expect(rows).to_contain_text("bad_token")
    await expect(rows).not_to_contain_text("forged")  # the secret header is masked
    await shot(page, "rejections")


async def _eventually_paused(relay: Relay) -> bool:
    for _ in range(20):
        if "crm" in relay.scheduler.paused:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_readable_on_a_phone_and_keyboard_usable(
    browser: Browser, setup: tuple[Relay, Any]
) -> None:
    relay, _ = setup
    page = await browser.new_page(viewport={"width": 360, "height": 740})
    await sign_in(page, relay)
    for path, name in (
        ("/", "overview"),
        ("/deliveries", "deliveries"),
        ("/dead", "dead"),
        ("/targets", "targets"),
        ("/events/1", "event"),
    ):
        await page.goto(relay.admin_url + path)
        # Nothing wider than the screen but the tables' own scrolling boxes.
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360, f"{path} is {width}px wide"
        await shot(page, f"phone-{name}")
    await page.goto(relay.admin_url + "/")
    await page.keyboard.press("Tab")
    focused = await page.evaluate("document.activeElement.textContent")
    assert focused == "Skip to content"


async def test_without_a_session_every_page_sends_to_login_and_posts_need_csrf(
    browser: Browser, setup: tuple[Relay, Any]
) -> None:
    relay, _ = setup
    page = await browser.new_page()
    for path in ("/", "/deliveries", "/dead", "/targets", "/rejections", "/events/1"):
        await page.goto(relay.admin_url + path)
        assert page.url.startswith(relay.admin_url + "/login?next=")
    await page.goto(relay.admin_url + "/login")
    await page.get_by_label("Admin token").fill("wrong-token-0000000000")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator(".problem")).to_have_text("Wrong token.")

    # Signed in, but a form without its CSRF token (a cross-site attempt) is refused.
    await sign_in(page, relay)
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with aiohttp.ClientSession(cookies=cookies) as http:
        for path in ("/targets/crm/pause", "/dead/requeue", "/deliveries/1/retry", "/logout"):
            async with http.post(
                relay.admin_url + path, data={"confirm": "yes"}, allow_redirects=False
            ) as response:
                assert response.status == 403, path
            async with http.post(
                relay.admin_url + path, data={"csrf": "forged"}, allow_redirects=False
            ) as response:
                assert response.status == 403, path
    assert relay.scheduler.paused == frozenset()
    headers = (await page.goto(relay.admin_url + "/")).headers  # type: ignore[union-attr]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    set_cookie = next(c for c in await page.context.cookies() if c["name"] == "relay_session")
    assert set_cookie["httpOnly"] is True
    assert set_cookie["sameSite"] == "Strict"


async def test_a_key_conflict_is_shown_and_links_to_the_first_event(
    browser: Browser, setup: tuple[Relay, Any]
) -> None:
    relay, _ = setup
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            relay.ingress_url + "/hooks/orders",
            json={"order": 99, "customer": "Boris"},  # another order under a used key
            headers={"Idempotency-Key": "order-1"},
        ) as response,
    ):
        conflict_id = (await response.json())["id"]
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    await page.get_by_role("link", name="Deliveries", exact=True).click()
    await page.get_by_label("Search").fill("order-1")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator("table.events tbody tr")).to_have_count(2)
    badge = page.locator("table.events .badge.conflict")
    await expect(badge).to_have_count(1)
    await expect(badge).to_have_text("key conflict")
    await shot(page, "key-conflict-list")
    await page.goto(f"{relay.admin_url}/events/{conflict_id}")
    warning = page.locator("dd.warning")
    await expect(warning).to_contain_text("whose payload differs")
    await warning.get_by_role("link").click()
    await expect(page.get_by_role("heading", name="Event #1")).to_be_visible()
    await shot(page, "key-conflict-event")
