"""Find a lead by what it says, and resend it corrected, in a real headless Chromium (Debian's).

Screenshots land in test-artifacts/dashboard/.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright, expect

from relay.app import Relay

from conftest import ConfigFactory, RelayFactory, SinkFactory

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
TOKEN = "dashboard-token-0123456789"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
# Tilda posts application/x-www-form-urlencoded with the fields Name, Email,
# Phone, plus tranid and formid (https://exceltic.dev/en/kommo-tilda-forma-v-sdelku/).
LEADS = [
    "Name=%D0%98%D0%B2%D0%B0%D0%BD&Phone=%2B7+%28999%29+123-45-67&tranid=1:1&formid=f1",
    "Name=Maria&Phone=89991234567&tranid=1:2&formid=f1",
    "Name=Oleg&Phone=89990000000&tranid=1:3&formid=f1",
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed (Debian: apt-get install chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        await browser.close()


@pytest.fixture
async def setup(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> tuple[Relay, Any, list[str]]:
    crm, crm_url = await start_sink([400])  # refuses: dead at once
    config = make_config(
        {"crm": {"type": "http", "url": crm_url, "retry": {"retries": 0}}},
        {"tilda": {"path": "/hooks/tilda", "targets": ["crm"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    ids = []
    async with aiohttp.ClientSession() as http:
        for body in LEADS:
            async with http.post(
                relay.ingress_url + "/hooks/tilda", data=body.encode(), headers=FORM
            ) as response:
                assert response.status == 200
                ids.append((await response.json())["id"])
    await crm.wait_for(len(LEADS))
    await relay.indexer.catch_up()
    return relay, crm, ids


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def sign_in(page: Page, relay: Relay) -> None:
    await page.goto(relay.admin_url + "/")
    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()


async def test_a_phone_typed_differently_finds_the_leads(
    browser: Browser, setup: tuple[Relay, Any, list[str]]
) -> None:
    relay, _, ids = setup
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)

    await page.get_by_role("link", name="Deliveries", exact=True).click()
    await page.get_by_label("Search").fill("8 (999) 123 45 67")
    await page.get_by_role("button", name="Show").click()
    links = page.locator("table.events tbody tr th a")
    await expect(links).to_have_text([f"#{ids[1]}", f"#{ids[0]}"])
    await expect(page.locator("#search-note")).to_contain_text("every stored event is indexed")
    await shot(page, "search-phone")

    # The dead letter page searches too, in Cyrillic, any case.
    await page.get_by_role("link", name="Dead letter", exact=True).click()
    await page.get_by_label("Search").fill("ИВАН")
    await page.get_by_role("button", name="Show").click()
    await expect(links).to_have_text([f"#{ids[0]}"])
    await shot(page, "search-dead-cyrillic")

    # Too short to search: said so, nothing listed.
    await page.get_by_label("Search").fill("ab")
    await page.get_by_role("button", name="Show").click()
    await expect(page.locator(".problem")).to_contain_text("at least 3 characters")


PHONE = re.compile(r"^\+7\d{10}$")
LEAD = {"name": "Иван", "phone": "8 (999) 123-45-67"}


def crm(request: web.Request, number: int) -> Any:
    """A CRM that refuses a bad phone with 400 naming the field (as Close's API does:
    "contacts: Invalid phone number", https://integrately.com/integrations/close/error)."""

    async def answer() -> web.Response:
        lead = await request.json()
        if not PHONE.match(str(lead.get("phone", ""))):
            return web.json_response({"field": "phone", "error": "invalid"}, status=400)
        return web.json_response({"id": number})

    return answer()


async def test_a_rejected_lead_is_corrected_and_resent_from_the_dashboard(
    browser: Browser,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
) -> None:
    sink, url = await start_sink(crm)
    config = make_config(
        {"crm": {"type": "http", "url": url}, "audit": {"type": "file", "path": "audit.jsonl"}},
        {"leads": {"path": "/hooks/leads", "targets": ["crm", "audit"]}},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/leads", json=LEAD) as response,
    ):
        original = (await response.json())["id"]
    await sink.wait_for(1)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await sign_in(page, relay)
    await page.goto(relay.admin_url + f"/events/{original}")
    crm_card = page.locator("article.delivery-card", has_text="crm")
    await expect(crm_card.locator("h3 .status")).to_have_text("dead")

    await page.get_by_role("link", name="Edit and resend…").click()
    body = page.get_by_label("Body")
    text = await body.input_value()
    assert "8 (999) 123-45-67" in text
    await expect(page.get_by_label("crm")).to_be_checked()  # the dead one
    await expect(page.get_by_label("audit")).not_to_be_checked()
    await body.fill(text.replace("8 (999) 123-45-67", "+79991234567"))
    await page.get_by_role("button", name="Preview").click()
    await expect(page.locator("#preview-crm pre")).to_contain_text('"phone": "+79991234567"')
    await shot(page, "resend-preview")

    # Edited again after the preview: sending asks for a new look first.
    await body.fill((await body.input_value()).replace("+79991234567", "+79991234568"))
    await page.get_by_role("button", name="Send corrected copy to crm").click()
    await expect(page.locator(".problem")).to_contain_text("changed since the preview")
    await expect(page.locator("#preview-crm pre")).to_contain_text("+79991234568")
    await page.get_by_role("button", name="Send corrected copy to crm").click()

    await expect(page.locator(".flash")).to_contain_text(f"Corrected copy of event {original}")
    heading = await page.get_by_role("heading", level=1).text_content()
    copy = re.search(r"#(\d+)", heading or "")
    assert copy is not None
    await expect(page.locator("#resent-from")).to_contain_text(f"event #{original}")
    await sink.wait_for(2)
    assert json.loads(sink.requests[-1].body) == {"name": "Иван", "phone": "+79991234568"}
    assert sink.requests[-1].headers["X-Relay-Event-Id"] == copy.group(1)
    # Its own delivery's key, not the original's: a receiver that remembers keys takes it.
    assert (
        sink.requests[-1].headers["Idempotency-Key"] != sink.requests[0].headers["Idempotency-Key"]
    )
    await shot(page, "resend-copy")

    await page.locator("#resent-from a").click()
    await expect(page.locator("#resent-as")).to_contain_text(f"event #{copy.group(1)}")
    await expect(page.locator("#resent-as")).to_contain_text("sent by dashboard session")
    await expect(crm_card.locator("tr.attempt")).to_have_count(1)  # its history is unchanged
    # The copy was delivered: the original's dead delivery is resolved, linked
    # to the copy's, and no longer counted dead.
    for _ in range(50):
        if (await relay.store.stats()).dead == 0:
            break
        await asyncio.sleep(0.05)
    await page.reload()
    await expect(crm_card.locator("h3 .status")).to_have_text("resolved")
    resolved = crm_card.locator("p.resolved")
    await expect(resolved).to_contain_text("of a corrected copy was delivered")
    await expect(page.locator("nav .badge.dead")).to_have_count(0)
    await shot(page, "resend-original")
    await crm_card.locator("p.resolved a").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(f"#{copy.group(1)}")
