"""The admin API over real HTTP: auth, listing, retry vs requeue, pause, stats, metrics."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.config import ConfigError
from relay.core.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory

TOKEN = "admin-token-0123456789"
ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}


def auth() -> dict[str, str]:
    # An API change must say it sends JSON (a web page cannot without a preflight).
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


async def post_event(relay: Relay, http: aiohttp.ClientSession, key: str) -> str:
    async with http.post(
        relay.ingress_url + "/hooks/orders", json={"key": key}, headers={"Idempotency-Key": key}
    ) as response:
        assert response.status == 200
        event_id: str = (await response.json())["id"]
        return event_id


async def api(
    http: aiohttp.ClientSession,
    relay: Relay,
    method: str,
    path: str,
    status: int = 200,
    **kwargs: Any,
) -> Any:
    async with http.request(method, relay.admin_url + path, headers=auth(), **kwargs) as response:
        assert response.status == status, await response.text()
        return await response.json()


@pytest.fixture
async def relay_with_sink(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> tuple[Relay, Any]:
    sink, url = await start_sink([503])
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        ROUTES,
        retry={"retries": 2},
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, background=False, clock=FakeClock())
    return relay, sink


async def test_api_needs_the_token_health_does_not(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, _ = relay_with_sink
    for path in ("/api/v1/events", "/api/v1/stats", "/api/v1/targets"):
        async with http.get(relay.admin_url + path) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.get(
            relay.admin_url + path, headers={"Authorization": "Bearer wrong-token-0123456789"}
        ) as r:
            assert r.status == 401
    async with http.post(relay.admin_url + "/api/v1/requeue") as response:
        assert response.status == 401
    async with http.get(relay.admin_url + "/healthz") as response:
        assert response.status == 200
    async with http.get(relay.admin_url + "/readyz") as response:
        # background=False: the scheduler loop is not running, and readyz says so.
        assert response.status == 503
        assert "scheduler not running" in (await response.json())["problems"]


def test_refuses_a_public_admin_listener_without_a_token(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r"admin\.token: is required when the admin listener"):
        make_config(
            {"a": {"type": "file", "path": "a"}},
            {"r": {"path": "/r", "targets": ["a"]}},
            admin={"listen": "0.0.0.0:8081"},
        )


async def test_events_listing_filters_and_cursor(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, _ = relay_with_sink
    ids = [await post_event(relay, http, f"k{i}") for i in range(5)]
    page = await api(http, relay, "GET", "/api/v1/events?limit=2")
    assert [e["id"] for e in page["events"]] == [ids[4], ids[3]]
    page2 = await api(http, relay, "GET", f"/api/v1/events?limit=2&cursor={page['next_cursor']}")
    assert [e["id"] for e in page2["events"]] == [ids[2], ids[1]]
    found = await api(http, relay, "GET", "/api/v1/events?key=k3")
    assert [e["id"] for e in found["events"]] == [ids[3]]
    # A typo is no empty page: it names the valid routes.
    typo = await api(http, relay, "GET", "/api/v1/events?route=nope", status=400)
    assert typo["error"].startswith("route: no route nope; the routes are: ")
    pending = await api(http, relay, "GET", "/api/v1/events?status=pending&target=crm")
    assert len(pending["events"]) == 5
    await api(http, relay, "GET", "/api/v1/events?status=weird", status=400)
    await api(http, relay, "GET", "/api/v1/events?limit=0", status=400)
    await api(http, relay, "GET", "/api/v1/events?since=next+tuesday", status=400)
    assert len((await api(http, relay, "GET", "/api/v1/events?since=yesterday"))["events"]) == 5
    detail = await api(http, relay, "GET", f"/api/v1/events/{ids[0]}")
    assert detail["idempotency_key"] == "k0"
    assert detail["deliveries"][0]["attempts_log"] == []
    await api(http, relay, "GET", "/api/v1/events/999999", status=404)


async def test_retry_adds_one_attempt_and_a_dead_delivery_stays_dead(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, sink = relay_with_sink
    event_id = await post_event(relay, http, "k")
    await relay.scheduler.drain()
    [delivery] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (delivery["status"], delivery["attempts"]) == ("dead", 3)

    answer = await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/retry")
    assert answer["delivery"]["status"] == "pending"
    await relay.scheduler.drain()
    [after] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (after["status"], after["attempts"]) == ("dead", 4)  # exactly one more
    assert len(after["attempts_log"]) == 4
    assert [h["kind"] for h in after["history"]] == ["retry"]
    assert len(sink.requests) == 4

    sink.script = [200]  # the target is fixed: the next manual attempt delivers
    await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/retry")
    await relay.scheduler.drain()
    [fixed] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (fixed["status"], fixed["attempts"]) == ("delivered", 5)
    await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/retry", status=409)
    await api(http, relay, "POST", "/api/v1/deliveries/424242/retry", status=404)


async def test_retry_of_a_pending_delivery_keeps_its_schedule(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, _ = relay_with_sink
    event_id = await post_event(relay, http, "k")
    await relay.scheduler.run_once()
    await relay.scheduler.wait_idle()
    [delivery] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (delivery["status"], delivery["attempts"]) == ("pending", 1)
    scheduled = delivery["next_attempt_at"]
    await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/retry")
    await relay.scheduler.run_once()  # due now, though the schedule said later
    await relay.scheduler.wait_idle()
    [after] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (after["status"], after["attempts"]) == ("pending", 2)
    assert after["next_attempt_at"] == scheduled
    await relay.scheduler.drain()
    [final] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    # The manual attempt did not use up a retry: 1 + 2 scheduled retries + 1 manual.
    assert (final["status"], final["attempts"]) == ("dead", 4)


async def test_requeue_starts_a_fresh_cycle_and_keeps_the_history(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, sink = relay_with_sink
    ids = [await post_event(relay, http, f"k{i}") for i in range(3)]
    await relay.scheduler.drain()
    assert len(sink.requests) == 9
    requeued = await api(http, relay, "POST", "/api/v1/requeue", json={"route": "orders"})
    assert requeued["requeued"] == 3
    again = await api(
        http, relay, "POST", "/api/v1/requeue", json={"ids": requeued["ids"], "status": "dead"}
    )
    assert again["requeued"] == 0  # already pending: nothing to do
    await relay.scheduler.drain()
    detail = await api(http, relay, "GET", f"/api/v1/events/{ids[0]}")
    [delivery] = detail["deliveries"]
    # A fresh cycle: three more attempts (1 + 2 retries), six in all, then dead again.
    assert (delivery["status"], delivery["attempts"]) == ("dead", 6)
    assert [a["number"] for a in delivery["attempts_log"]] == [1, 2, 3, 4, 5, 6]
    assert [h["kind"] for h in delivery["history"]] == ["requeue"]
    sink.script = [200]
    fixed = await api(http, relay, "POST", "/api/v1/requeue", json={})
    assert fixed["requeued"] == 3
    await relay.scheduler.drain()
    events = (await api(http, relay, "GET", "/api/v1/events"))["events"]
    assert {e["status"] for e in events} == {"delivered"}
    await api(http, relay, "POST", "/api/v1/requeue", json={"colour": "red"}, status=400)


async def test_bulk_requeue_and_skip_take_what_the_filters_and_search_name(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, sink = relay_with_sink
    ids = [await post_event(relay, http, key) for key in ("anna-1", "boris", "anna-2", "vera")]
    await relay.scheduler.drain()
    await relay.indexer.catch_up()
    # A dry run says how many and which, and changes nothing.
    path = "/api/v1/requeue"
    dry = await api(http, relay, "POST", path, json={"q": "anna", "dry_run": True})
    assert dry["dry_run"] is True
    assert dry["would_requeue"] == 2
    deliveries = {
        event_id: (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"][0]
        for event_id in ids
    }
    assert dry["ids"] == [deliveries[ids[0]]["id"], deliveries[ids[2]]["id"]]
    assert (await api(http, relay, "GET", "/api/v1/stats"))["dead"] == 4
    # The search narrows the action itself: 2 requeued, not the 4 dead of the route.
    sink.script = [200]
    done = await api(http, relay, "POST", path, json={"route": "orders", "q": "anna"})
    assert (done["requeued"], done["ids"]) == (2, dry["ids"])
    await relay.scheduler.drain()
    assert (await api(http, relay, "GET", "/api/v1/stats"))["dead"] == 2
    # Bulk skip, by key; a dry run first.
    skip = "/api/v1/skip"
    dry = await api(http, relay, "POST", skip, json={"key": "vera", "dry_run": True})
    assert (dry["would_skip"], dry["ids"]) == (1, [deliveries[ids[3]]["id"]])
    done = await api(http, relay, "POST", skip, json={"key": "vera"})
    assert (done["skipped"], done["ids"]) == (1, dry["ids"])
    stats = await api(http, relay, "GET", "/api/v1/stats")
    assert (stats["dead"], stats["targets"]["crm"]["skipped"]) == (1, 1)
    await api(http, relay, "POST", skip, json={"q": "a"}, status=400)  # too short to search
    await api(http, relay, "POST", skip, json={"dry_run": "yes"}, status=400)
    await api(http, relay, "POST", skip, json={"status": "delivered"}, status=400)


async def test_every_action_through_the_api_is_recorded_with_its_caller(
    relay_with_sink: tuple[Relay, Any],
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay, _ = relay_with_sink
    event_id = await post_event(relay, http, "k1")
    await relay.scheduler.drain()
    [delivery] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    with caplog.at_level("INFO", logger="relay.audit"):
        await api(http, relay, "POST", "/api/v1/targets/crm/pause")
        await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/retry")
        await api(http, relay, "POST", f"/api/v1/deliveries/{delivery['id']}/skip")
        await api(http, relay, "POST", "/api/v1/targets/crm/resume")
    caller = "admin API from 127.0.0.1 (admin token)"
    said = [r.__dict__["fields"] for r in caplog.records if r.name == "relay.audit"]
    assert [(f["action"], f["by"], f["count"]) for f in said] == [
        ("pause", caller, 0),
        ("retry", caller, 1),
        ("skip", caller, 1),
        ("resume", caller, 0),
    ]
    page = await api(http, relay, "GET", "/api/v1/audit?limit=3")
    assert [(a["action"], a["by"], a["subject"]) for a in page["audit"]] == [
        ("resume", caller, "target crm"),
        ("skip", caller, f"delivery {delivery['id']}"),
        ("retry", caller, f"delivery {delivery['id']}"),
    ]
    assert page["audit"][1]["deliveries"] == [delivery["id"]]
    rest = await api(http, relay, "GET", f"/api/v1/audit?cursor={page['next_cursor']}")
    assert [a["action"] for a in rest["audit"]] == ["pause"]
    detail = await api(http, relay, "GET", f"/api/v1/events/{event_id}")
    history = detail["deliveries"][0]["history"]
    assert [(h["kind"], h["by"]) for h in history] == [("retry", caller), ("skip", caller)]


async def test_pause_burns_no_attempts_and_resume_drains(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, sink = relay_with_sink
    sink.script = [200]
    await api(http, relay, "POST", "/api/v1/targets/crm/pause")
    event_id = await post_event(relay, http, "k")
    relay.clock.advance(3600)  # type: ignore[attr-defined]
    await relay.scheduler.drain()
    [delivery] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (delivery["status"], delivery["attempts"]) == ("pending", 0)
    assert sink.requests == []
    targets = (await api(http, relay, "GET", "/api/v1/targets"))["targets"]
    assert targets[0]["paused"] is True
    assert targets[0]["deliveries"]["pending"] == 1
    await api(http, relay, "POST", "/api/v1/targets/nope/pause", status=404)

    await api(http, relay, "POST", "/api/v1/targets/crm/resume")
    await relay.scheduler.drain()
    [delivery] = (await api(http, relay, "GET", f"/api/v1/events/{event_id}"))["deliveries"]
    assert (delivery["status"], delivery["attempts"]) == ("delivered", 1)


async def test_pause_survives_a_restart(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    config = make_config({"crm": {"type": "file", "path": "out"}}, ROUTES, admin={"token": TOKEN})
    first = await start_relay(config, background=False)
    await api(http, first, "POST", "/api/v1/targets/crm/pause")
    await first.stop()
    second = await start_relay(config, background=False)
    await second.scheduler.drain()
    assert second.scheduler.paused == frozenset({"crm"})


async def test_stats(relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession) -> None:
    relay, sink = relay_with_sink
    for i in range(2):
        await post_event(relay, http, f"k{i}")
    await relay.scheduler.drain()
    sink.script = [200]
    await post_event(relay, http, "ok")
    await relay.scheduler.run_once()
    await relay.scheduler.wait_idle()
    relay.clock.advance(90)  # type: ignore[attr-defined]
    await post_event(relay, http, "waiting")
    stats = await api(http, relay, "GET", "/api/v1/stats")
    assert stats["routes"]["orders"]["dead"] == 2
    assert stats["routes"]["orders"]["delivered"] == 1
    assert stats["routes"]["orders"]["pending"] == 1
    crm = stats["targets"]["crm"]
    assert crm["dead"] == 2
    assert crm["paused"] is False
    assert crm["last_success_at"] is not None
    assert crm["consecutive_failures"] == 0
    assert crm["last_error"] == "HTTP 503"
    assert stats["dead"] == 2
    assert stats["oldest_pending_age_seconds"] == 0
    assert stats["pending_after_first_attempt"] == 0


async def metric(http: aiohttp.ClientSession, relay: Relay, line_start: str) -> float:
    relay.console.changed()  # skip the 5 s snapshot cache
    async with http.get(relay.admin_url + "/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start} in:\n{text}")


async def test_metrics_show_the_dead_gauge_go_up_and_down(
    relay_with_sink: tuple[Relay, Any], http: aiohttp.ClientSession
) -> None:
    relay, sink = relay_with_sink
    dead = 'relay_deliveries{status="dead",target="crm"}'
    assert await metric(http, relay, dead) == 0
    # Every series the config implies is there at 0 before anything happens:
    # `increase(...) > 0` sees the first one, no rule needs `or vector(0)`.
    for series in (
        'relay_attempts_total{outcome="dead",route="orders",target="crm"}',
        'relay_attempts_total{outcome="success",route="orders",target="crm"}',
        'relay_deliveries_dead_total{route="orders",target="crm"}',
        'relay_events_received_total{result="unavailable",route="orders"}',
        'relay_key_conflicts_total{route="orders"}',
        'relay_alerts_total{kind="dead"}',
        'relay_config_reloads_total{result="failed"}',
        'relay_deliveries_held{target="crm"}',
        "relay_search_index_behind_events",
    ):
        assert await metric(http, relay, series + " ") == 0, series
    assert await metric(http, relay, "relay_storage_free_bytes") > 0
    await post_event(relay, http, "k")
    await post_event(relay, http, "k")
    assert await metric(http, relay, 'relay_events_received_total{result="queued"') == 1
    assert await metric(http, relay, 'relay_events_received_total{result="duplicate"') == 1
    await relay.scheduler.drain()
    assert await metric(http, relay, dead) == 1
    # One vocabulary with the attempt log: the last attempt is the one that made it dead.
    retried = 'relay_attempts_total{outcome="retry",route="orders",target="crm"}'
    assert await metric(http, relay, retried) == 2
    ended = 'relay_attempts_total{outcome="dead",route="orders",target="crm"}'
    assert await metric(http, relay, ended) == 1
    assert await metric(http, relay, 'relay_deliveries_dead_total{route="orders"') == 1
    sink.script = [200]
    await api(http, relay, "POST", "/api/v1/requeue", json={})
    await relay.scheduler.drain()
    assert await metric(http, relay, dead) == 0
    assert await metric(http, relay, "relay_ingest_ack_seconds_count") == 2
    assert await metric(http, relay, 'relay_target_paused{target="crm"}') == 0
    assert await metric(http, relay, "relay_oldest_pending_seconds") == 0
