"""Send the waiting ones now: after a CRM outage (without hold_when_down) the
fixed CRM would wait for each delivery's backoff, an hour here. A retry now
by filter sends them at once, each a person's retry (its count kept, no new
cycle), at the target's rate; a paused target is refused with how to resume
it; a down one gets one probe, not the whole backlog at once.

A real SQLite file, a real CRM stand-in on 127.0.0.1, an injected clock; the
admin API in process, and the CLI in a subprocess on the same database."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import arelay_cli, write_config

TOKEN = "admin-token-0123456789"
ROUTES = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}
HOUR = 3600.0


class Crm:
    """Down (503) until `fixed`, then it takes every lead; each request's
    time on the relay's clock is kept."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.fixed = False
        self.seen: list[tuple[float, int]] = []

    def __call__(self, request: web.Request, number: int) -> web.Response:
        self.seen.append((self.clock.now(), 200 if self.fixed else 503))
        return web.Response(status=200 if self.fixed else 503)


async def outage(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    leads: int,
    **crm: Any,
) -> tuple[Relay, Crm, FakeClock]:
    """`leads` leads, each failed once while the CRM was down, now waiting an
    hour for their retry; then the CRM is fixed."""
    clock = FakeClock()
    stand_in = Crm(clock)
    _, url = await start_sink(stand_in)
    retry = {"delays": ["1h", "2h"], "jitter": 0}
    config = make_config(
        {"crm": {"type": "http", "url": url, "retry": retry, **crm}},
        ROUTES,
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=clock)
    async with aiohttp.ClientSession() as http:
        for n in range(leads):
            async with http.post(relay.ingress_url + "/hooks/leads", json={"n": n}) as answer:
                assert answer.status == 200
    while len(stand_in.seen) < leads:
        await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()
        clock.advance(1)
    stand_in.fixed = True
    return relay, stand_in, clock


async def api(relay: Relay, method: str, path: str, expect: int, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, relay.admin_url + path, headers=headers, **kw) as response,
    ):
        assert response.status == expect, await response.text()
        return await response.json()


async def test_the_waiting_backlog_is_sent_now_at_the_targets_rate(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    relay, crm, clock = await outage(make_config, start_relay, start_sink, 4, rate="2/s")
    fixed_at = clock.now()
    plan = await api(relay, "POST", "/api/v1/retry", 200, json={"target": "crm", "dry_run": True})
    assert (plan["would_retry"], len(plan["ids"])) == (4, 4)
    done = await api(relay, "POST", "/api/v1/retry", 200, json={"target": "crm"})
    assert (done["retried"], sorted(done["ids"]), done["probed"]) == (4, sorted(plan["ids"]), [])
    await relay.scheduler.drain()
    sent = [at for at, status in crm.seen if status == 200]
    # All four within two seconds of the fix, not an hour later; half a second
    # apart at least (2/s).
    assert len(sent) == 4
    assert sent[-1] - fixed_at < 2.5
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(sent))
    for delivery_id in done["ids"]:
        view = await relay.store.get_delivery(int(delivery_id))
        assert view is not None
        # One more attempt each, the cycle's count as it was: no new cycle.
        assert (view.status, view.attempts, view.attempts_in_cycle) == (Status.DELIVERED, 2, 1)
    [entry] = await relay.store.list_audit(1)
    assert (entry.action, entry.subject, entry.count) == ("retry", "pending, target crm", 4)


async def test_a_paused_target_is_refused_saying_how_to_resume_it(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    relay, crm, _ = await outage(make_config, start_relay, start_sink, 2)
    await api(relay, "POST", "/api/v1/targets/crm/pause", 200, json={})
    refused = await api(relay, "POST", "/api/v1/retry", 409, json={"target": "crm"})
    assert refused["error"].startswith("target crm is paused: nothing is sent to it;")
    assert "relay resume crm" in refused["error"]
    assert await relay.scheduler.run_once() == 0
    assert len(crm.seen) == 2
    bad = await api(relay, "POST", "/api/v1/retry", 400, json={"status": "delivered"})
    assert bad["error"].startswith("status: a retry now takes pending or dead")


async def test_a_retry_by_id_to_a_paused_target_says_it_waits_for_the_resume(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory, tmp_path: Path
) -> None:
    # It said "one more attempt queued" and nothing went until a resume.
    relay, _, _ = await outage(make_config, start_relay, start_sink, 1)
    await api(relay, "POST", "/api/v1/targets/crm/pause", 200, json={})
    [event] = await relay.store.list_events(EventQuery())
    [delivery] = event.deliveries
    config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(relay.config.storage.path)},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/"}},
            "routes": ROUTES,
        },
    )
    said = (await arelay_cli("retry", str(delivery.id), "--config", str(config))).stdout
    assert "target crm is paused: it goes once resumed (relay resume crm)" in said


async def test_a_down_target_is_probed_once_and_then_the_backlog_flows(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    relay, crm, clock = await outage(
        make_config, start_relay, start_sink, 3, hold_when_down=True, down_after=3, concurrency=4
    )
    assert "crm" in relay.scheduler.down
    fixed_at = clock.now()
    done = await api(relay, "POST", "/api/v1/retry", 200, json={"target": "crm"})
    assert done["probed"] == ["crm"]
    assert await relay.scheduler.run_once() == 1  # one probe, not the backlog at once
    await relay.scheduler.wait_idle()
    assert crm.seen[-1][1] == 200
    await relay.scheduler.drain()
    sent = [at for at, status in crm.seen if status == 200]
    assert len(sent) == 3
    assert sent[-1] - fixed_at < 1


async def test_the_cli_plans_sends_and_lists_ids_with_their_next_attempt(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    tmp_path: Path,
) -> None:
    relay, crm, _ = await outage(make_config, start_relay, start_sink, 2)
    config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(relay.config.storage.path)},
            "targets": {"crm": {"type": "http", "url": "http://127.0.0.1:9/"}},
            "routes": ROUTES,
        },
    )
    cli = ("--config", str(config))
    # `relay events` names each delivery, and when a waiting one goes next.
    listed = (await arelay_cli("events", *cli)).stdout
    events = await relay.store.list_events(EventQuery())
    ids = [d.id for event in events for d in event.deliveries]
    assert all(f"crm#{i}:pending(1) next " in listed for i in ids), listed
    plan = tmp_path / "plan.json"
    dry = await arelay_cli("retry", "--target", "crm", "--dry-run", "--json", *cli)
    plan.write_text(dry.stdout)
    assert json.loads(dry.stdout)["would_retry"] == 2
    said = (await arelay_cli("retry", "--plan", str(plan), *cli)).stdout
    assert said.startswith("sent now: 2 deliveries")
    await relay.scheduler.drain()
    assert [status for _, status in crm.seen] == [503, 503, 200, 200]
    again = await arelay_cli("retry", "--plan", str(plan), "--json", *cli)
    done = json.loads(again.stdout)
    assert (done["retried"], sorted(done["not_taken_why"].values())) == (
        0,
        ["delivered", "delivered"],
    )
    mixed = await arelay_cli("retry", "--plan", str(plan), "--route", "leads", *cli, check=False)
    assert "give no filters" in mixed.stderr


async def _csrf(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as page:
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
    assert found is not None
    return found.group(1)


async def test_the_dashboard_sends_a_targets_waiting_ones_after_a_confirmation(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    relay, crm, _ = await outage(make_config, start_relay, start_sink, 2)
    admin = relay.admin_url
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        login = await _csrf(http, admin + "/login")
        signed = {"csrf": login, "token": TOKEN, "next": "/targets"}
        async with http.post(admin + "/login", data=signed) as page:
            targets = await page.text()
        assert "Send its 2 waiting now…" in targets
        csrf = await _csrf(http, admin + "/targets")
        form = {"csrf": csrf, "target": "crm", "status": "pending", "from": "targets"}
        async with http.post(admin + "/retry", data=form) as page:
            confirm = await page.text()
        assert "<h1>Send pending deliveries now</h1>" in confirm  # was "Send now pending"
        assert "This will send now <strong>2</strong> pending deliveries" in confirm
        ids = re.search(r'name="ids" value="([^"]*)"', confirm)
        assert ids is not None
        confirmed = {**form, "confirm": "yes", "ids": ids.group(1)}
        async with http.post(admin + "/retry", data=confirmed) as page:
            assert page.url.path == "/targets"
            assert "Sent now: 2" in await page.text()
        await relay.scheduler.drain()
        assert [status for _, status in crm.seen] == [503, 503, 200, 200]

        # Filtered to pending, the Deliveries page offers the same; a paused
        # target is refused there, saying how to resume it.
        async with http.post(relay.ingress_url + "/hooks/leads", json={"n": 9}) as answer:
            assert answer.status == 200
        crm.fixed = False
        await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()
        async with http.get(admin + "/deliveries", params={"status": "pending"}) as page:
            assert 'id="send-now"' in await page.text()
        await relay.store.set_paused("crm", True, relay.clock.now())
        relay.console.changed()
        await relay.scheduler.run_once()
        form = {"csrf": csrf, "status": "pending", "target": "crm"}
        async with http.post(admin + "/retry", data=form) as page:
            refused = await page.text()
        assert "Target crm is paused: nothing is sent to it; resume it first" in refused
        assert "Send now 1</button>" not in refused
