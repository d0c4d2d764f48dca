"""Every screen says times in the operator's zone (admin.timezone), with its
offset: never a UTC "…Z" where a person reads it (the Audit and the
Overview's "Needs attention" showed UTC while the rest showed the zone)."""

from __future__ import annotations

import html
import re

import aiohttp

from relay.core.clock import FakeClock
from relay.store import Selection

from conftest import ConfigFactory, RelayFactory, SinkFactory

UTC_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d+)?)?Z")
TAG = re.compile(r"<[^>]*>")
PAGES = ("/", "/deliveries", "/dead", "/targets", "/rejections", "/audit", "/events/1")


async def test_no_screen_shows_a_utc_time(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    _, url = await start_sink([503])
    config = make_config(
        {
            "crm": {
                "type": "http",
                "url": url,
                "hold_when_down": True,
                "down_after": 1,
                "retry": {"retries": 1},
            },
            "mail": {"type": "file", "path": "mail.jsonl"},
        },
        {
            "leads": {"path": "/hooks/leads", "targets": ["crm"]},
            "signed": {
                "path": "/hooks/signed",
                "source": "tilda",
                "api_key": "k-1234",
                "targets": ["mail"],
            },
        },
        admin={"timezone": "Asia/Vladivostok"},  # UTC+10:00, no summer time
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    async with aiohttp.ClientSession() as http:
        async with http.post(relay.ingress_url + "/hooks/leads", json={"n": 1}) as answer:
            assert answer.status == 200
        async with http.post(relay.ingress_url + "/hooks/signed", data={"a": "1"}) as answer:
            assert answer.status == 401  # a rejection, with its time
        await relay.scheduler.run_once()  # the first attempt: 503, crm is down now
        await relay.scheduler.wait_idle()
        await relay.store.set_paused("mail", True, relay.clock.now(), by="test")
        await relay.store.requeue(Selection(), relay.clock.now(), by="test")
        for path in PAGES:
            async with http.get(relay.admin_url + path) as page:
                assert page.status == 200, path
                text = html.unescape(TAG.sub(" ", await page.text()))
            assert UTC_TIME.findall(text) == [], path
            assert "+10:00" in text or path == "/dead", path  # nothing is dead: no time
