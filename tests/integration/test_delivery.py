"""Delivery through the scheduler to real local HTTP targets, on an injected clock."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.core.payload import event_fields
from relay.core.secrets import Masker
from relay.ops.views import event_summary
from relay.store import EventDetail, Selection, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import free_port, post_accepted


async def post(
    relay: Relay,
    http: aiohttp.ClientSession,
    body: bytes = b'{"n": 1}',
    headers: dict[str, str] | None = None,
) -> int:
    return await post_accepted(http, relay.ingress_url + "/hooks/orders", body, headers)


async def detail(relay: Relay, event_id: int) -> EventDetail:
    found = await relay.store.get_event(event_id)
    assert found is not None
    return found


def one_target(url: str, **target: Any) -> dict[str, Any]:
    return {"crm": {"type": "http", "url": url, **target}}


ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
EVENT_KEYS = tuple(event_fields(1, "orders", 0.0, None))


async def test_full_default_cycle_against_a_target_that_always_answers_503(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([503])
    clock = FakeClock()
    relay = await start_relay(make_config(one_target(url), ROUTES), background=False, clock=clock)
    event_id = await post(relay, http)
    await relay.scheduler.drain()

    [delivery] = (await detail(relay, event_id)).event.deliveries
    log = (await detail(relay, event_id)).attempts[delivery.id]
    assert delivery.status is Status.DEAD
    assert delivery.attempts == 16
    assert len(sink.requests) == 16
    starts = [attempt.started_at for attempt in log]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(starts)]
    assert gaps == [2.0**n for n in range(1, 16)]
    assert starts[-1] - starts[0] == pytest.approx(65534)
    assert [a.number for a in log] == list(range(1, 17))
    assert all(a.http_status == 503 and a.outcome == "retry" for a in log)
    assert "gave up after 16 attempts" in (delivery.last_error or "")
    assert [r.headers["X-Relay-Attempt"] for r in sink.requests] == [str(n) for n in range(1, 17)]


@pytest.mark.parametrize(
    ("status", "attempts", "final"),
    [
        (500, 3, Status.DEAD),
        (502, 3, Status.DEAD),
        (503, 3, Status.DEAD),
        (400, 1, Status.DEAD),
        (404, 1, Status.DEAD),
        (302, 1, Status.DEAD),
        (200, 1, Status.DELIVERED),
        (204, 1, Status.DELIVERED),
    ],
)
async def test_classification_by_status(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    status: int,
    attempts: int,
    final: Status,
) -> None:
    def answer(request: web.Request, number: int) -> web.StreamResponse:
        if status == 302:
            return web.Response(status=302, headers={"Location": "/elsewhere"})
        return web.Response(status=status, text="x" * 5000)

    sink, url = await start_sink(answer)
    config = make_config(one_target(url), ROUTES, retry={"retries": 2})
    relay = await start_relay(config, background=False, clock=FakeClock())
    event_id = await post(relay, http)
    await relay.scheduler.drain()
    found = await detail(relay, event_id)
    [delivery] = found.event.deliveries
    assert (delivery.status, delivery.attempts) == (final, attempts)
    assert [r.path for r in sink.requests] == ["/hook"] * attempts  # redirects not followed
    for attempt in found.attempts[delivery.id]:
        assert attempt.http_status == status
        assert len(attempt.response) <= 2048


async def test_429_waits_at_least_retry_after(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    def answer(request: web.Request, number: int) -> web.StreamResponse:
        if number == 0:
            return web.Response(status=429, headers={"Retry-After": "120"})
        return web.Response(status=200)

    _sink, url = await start_sink(answer)
    relay = await start_relay(
        make_config(one_target(url), ROUTES), background=False, clock=FakeClock()
    )
    event_id = await post(relay, http)
    await relay.scheduler.drain()
    found = await detail(relay, event_id)
    [delivery] = found.event.deliveries
    first, second = found.attempts[delivery.id]
    assert delivery.status is Status.DELIVERED
    assert second.started_at - first.started_at == pytest.approx(120)


async def test_connection_refused_is_retried(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    config = make_config(one_target(url), ROUTES, retry={"retries": 2})
    relay = await start_relay(config, background=False, clock=FakeClock())
    event_id = await post(relay, http)
    await relay.scheduler.drain()
    found = await detail(relay, event_id)
    [delivery] = found.event.deliveries
    assert (delivery.status, delivery.attempts) == (Status.DEAD, 3)
    assert all("cannot connect" in (a.error or "") for a in found.attempts[delivery.id])


async def test_timeout_is_retried(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    async def hang(request: web.Request, number: int) -> web.StreamResponse:
        if number == 0:
            await asyncio.sleep(5)  # cut short by relay's 100 ms timeout
        return web.Response(status=200)

    _sink, url = await start_sink(hang)
    config = make_config(one_target(url), ROUTES, retry={"timeout": "100ms"})
    relay = await start_relay(config, background=False, clock=FakeClock())
    event_id = await post(relay, http)
    await relay.scheduler.drain()
    found = await detail(relay, event_id)
    [delivery] = found.event.deliveries
    first, _second = found.attempts[delivery.id]
    assert first.error == "timeout after 0.1s"
    assert first.outcome == "retry"
    assert delivery.status is Status.DELIVERED


async def test_fan_out_retries_each_target_on_its_own(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    tmp_path: Any,
) -> None:
    _sink, url = await start_sink([500, 503, 502, 200])
    targets = {**one_target(url), "audit": {"type": "file", "path": "audit.jsonl"}}
    routes = {"orders": {"path": "/hooks/orders", "targets": ["crm", "audit"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    event_id = await post(relay, http, headers={"Idempotency-Key": "order-7"})
    await relay.scheduler.drain()
    deliveries = {d.target: d for d in (await detail(relay, event_id)).event.deliveries}
    assert (deliveries["crm"].status, deliveries["crm"].attempts) == (Status.DELIVERED, 4)
    assert (deliveries["audit"].status, deliveries["audit"].attempts) == (Status.DELIVERED, 1)
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert '"idempotency_key":"order-7"' in lines[0]
    # One shape for an event everywhere: the file target's time is written as
    # the API, the CLI and templates write it (it was "...123456+00:00").
    record = json.loads(lines[0])
    shown = event_summary((await detail(relay, event_id)).event, Masker())
    assert record["received_at"] == shown["received_at"]
    assert record["received_at"].endswith("Z")


async def test_an_event_has_one_shape_in_templates_the_file_target_and_the_api(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    tmp_path: Any,
) -> None:
    # Each field of `event` as a template reads it (a header each), beside the
    # file target's record and the API's view of the same event.
    headers = {f"X-Event-{name}": f"{{{{ event.{name} }}}}" for name in EVENT_KEYS}
    sink, url = await start_sink()
    targets = {
        **one_target(url, headers=headers),
        "audit": {"type": "file", "path": "audit.jsonl"},
    }
    routes = {"orders": {"path": "/hooks/orders", "targets": ["crm", "audit"]}}
    relay = await start_relay(make_config(targets, routes), background=False, clock=FakeClock())
    keyed = await post(relay, http, headers={"Idempotency-Key": "order-8"})
    unkeyed = await post(relay, http, body=b'{"n": 2}')
    await relay.scheduler.drain()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len(records) == len(sink.requests) == 2
    for event_id in (keyed, unkeyed):
        shown = event_summary((await detail(relay, event_id)).event, Masker())
        [request] = [r for r in sink.requests if r.headers["X-Event-id"] == str(event_id)]
        [record] = [r for r in records if r["event_id"] == str(event_id)]
        rendered = {name: request.headers[f"X-Event-{name}"] for name in EVENT_KEYS}
        assert rendered == {
            name: record["event_id" if name == "id" else name] for name in EVENT_KEYS
        }
        # The API says null for an event without a key; templates and the
        # file target send its id instead (what a receiver de-duplicates by).
        assert rendered == {
            name: shown[name] or str(event_id) if name == "idempotency_key" else shown[name]
            for name in EVENT_KEYS
        }
        assert shown["received_at"].endswith("Z")
    assert [r["idempotency_key"] for r in records] == ["order-8", str(unkeyed)]


async def test_outgoing_request_carries_body_and_dedup_headers(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    sink, url = await start_sink([200])
    targets = one_target(url, headers={"Authorization": "Bearer ${CRM_TOKEN}"})
    config = make_config(targets, ROUTES, environ={"CRM_TOKEN": "tok-123"})
    relay = await start_relay(config, background=False, clock=FakeClock())
    body = b'{"z": 1,  "a": [1, 2]}'
    with_key = await post(relay, http, body, {"Idempotency-Key": "k-1"})
    without_key = await post(relay, http, body)
    await relay.scheduler.drain()
    by_event = {r.headers["X-Relay-Event-Id"]: r for r in sink.requests}
    keyed, unkeyed = by_event[str(with_key)], by_event[str(without_key)]
    assert keyed.body == body
    assert keyed.headers["Content-Type"] == "application/json"
    # Each delivery's own identity, whatever key its event came with: the
    # sender's key is unique only within its route (relay.core.identity).
    assert re.fullmatch(r"msg_relay_\d+_[0-9a-f]{16}", keyed.headers["Idempotency-Key"])
    assert re.fullmatch(r"msg_relay_\d+_[0-9a-f]{16}", unkeyed.headers["Idempotency-Key"])
    assert keyed.headers["Idempotency-Key"] != unkeyed.headers["Idempotency-Key"]
    assert keyed.headers["Authorization"] == "Bearer tok-123"
    assert keyed.headers["X-Relay-Attempt"] == "1"


async def test_concurrency_limit_per_target(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    in_flight = 0
    peak = 0

    async def slow(request: web.Request, number: int) -> web.StreamResponse:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return web.Response(status=200)

    sink, url = await start_sink(slow)
    config = make_config(one_target(url, concurrency=2), ROUTES)
    relay = await start_relay(config, background=False)
    for _ in range(10):
        await post(relay, http)
    await relay.scheduler.drain()
    assert len(sink.requests) == 10
    assert peak == 2


async def test_stop_gives_back_leases_of_unfinished_attempts(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    async def hang(request: web.Request, number: int) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(status=200)

    sink, url = await start_sink(hang)
    config = make_config(one_target(url), ROUTES, server={"shutdown_timeout": "50ms"})
    relay = await start_relay(config)
    event_id = await post(relay, http)
    await sink.wait_for(1)
    await relay.stop()
    relay2 = await start_relay(config, background=False)
    [delivery] = (await detail(relay2, event_id)).event.deliveries
    assert (delivery.status, delivery.attempts) == (Status.PENDING, 0)


async def test_a_claim_in_flight_when_stop_begins_is_given_back_and_starts_nothing(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop can be inside a claim (a database round trip) when stop()
    # begins. An attempt it started after stop() returned would run while the
    # store closes under it: its record lost, its lease held until it expires.
    sink, url = await start_sink([200])
    relay = await start_relay(make_config(one_target(url), ROUTES), background=False)
    event_id = await post(relay, http)
    store = relay.store
    claim_due = store.claim_due
    claiming, go_on = asyncio.Event(), asyncio.Event()

    async def claim_when_told(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        await go_on.wait()
        return await claim_due(*args, **kwargs)

    monkeypatch.setattr(store, "claim_due", claim_when_told)
    step = asyncio.create_task(relay.scheduler.step())
    await claiming.wait()
    stopping = asyncio.create_task(relay.scheduler.stop(grace=5.0))
    await asyncio.sleep(0.01)
    assert not stopping.done()  # it waits for the claim under way
    go_on.set()
    await stopping
    assert relay.scheduler.in_flight == 0
    assert await step == 0
    assert sink.requests == []
    # Given back: due again at once, for this process or the next.
    now = relay.clock.now()
    [again] = await claim_due(now, now + 60, {"crm": 1})
    assert again.event_id == event_id


async def test_the_attempt_log_counts_within_the_cycle_and_names_manual_retries(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The week's counters: after a manual retry of a dead delivery the log
    # said "attempt=5/4 outcome=dead", after a requeue "attempt=6/9".
    _, url = await start_sink([503])
    clock = FakeClock()
    config = make_config(one_target(url, retry={"retries": 3}), ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    event_id = await post(relay, http)
    await relay.scheduler.drain()
    [delivery] = (await detail(relay, event_id)).event.deliveries
    assert delivery.status is Status.DEAD
    caplog.clear()
    with caplog.at_level("INFO", logger="relay.attempts"):
        await relay.console.retry(delivery.id, by="test")
        await relay.scheduler.drain()
        await relay.console.requeue(Selection(ids=(delivery.id,)), by="test")
        await relay.scheduler.drain()
    said = [r.__dict__["fields"] for r in caplog.records if r.name == "relay.attempts"]
    assert [(f["attempt"], f["total"], f["outcome"]) for f in said] == [
        ("manual", 5, "dead"),
        ("1/4", 6, "retry"),
        ("2/4", 7, "retry"),
        ("3/4", 8, "retry"),
        ("4/4", 9, "dead"),
    ]
    attempts = (await detail(relay, event_id)).attempts[delivery.id]
    assert [(a.kind.value, a.cycle_number) for a in attempts] == [
        *(("cycle", n) for n in range(1, 5)),
        ("manual", None),
        *(("cycle", n) for n in range(1, 5)),
    ]


async def test_each_attempt_keeps_the_request_it_sent_beside_the_answer_secrets_masked(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The week's CRM refusing a field: to see what it received the operator
    # re-rendered by hand, which needs the service's secrets.
    sink, url = await start_sink([422])
    key = "crm-key-0123456789"
    target = {
        "type": "http",
        "url": url + "?token=${CRM_KEY}",
        "headers": {"Authorization": "Bearer ${CRM_KEY}", "X-Source": "relay"},
        "format": "form",
        "form": {"phone": "{{ json.phone }}", "api_key": "${CRM_KEY}", "note": "{{ json.note }}"},
    }
    config = make_config({"crm": target}, ROUTES, environ={"CRM_KEY": key})
    relay = await start_relay(config, background=False, clock=FakeClock())
    body = b'{"phone": "8 (999) 123-45-67", "note": "' + b"x" * 5000 + b'"}'
    event_id = await post(relay, http, body)
    await relay.scheduler.drain()

    assert key in sink.requests[0].path  # the CRM got the real request
    [delivery] = (await detail(relay, event_id)).event.deliveries
    [attempt] = (await detail(relay, event_id)).attempts[delivery.id]
    sent = attempt.request
    assert sent is not None
    assert sent.method == "POST"
    assert sent.url == url + "?token=***"
    headers = dict(sent.headers)
    assert (headers["Authorization"], headers["X-Source"]) == ("***", "relay")
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert sent.body.startswith(b"phone=8+%28999%29+123-45-67&api_key=***&note=xxx")
    assert len(sent.body) == 2048  # cut as the answer excerpt is
    assert key.encode() not in sent.body
    assert attempt.response == b"answer 0: 422"
    async with http.get(f"{relay.admin_url}/api/v1/events/{event_id}") as answer:
        shown = (await answer.json())["deliveries"][0]["attempts_log"][0]
    assert shown["request"]["url"] == url + "?token=***"
    assert ["Authorization", "***"] in shown["request"]["headers"]
    assert key not in json.dumps(shown)


async def test_a_redelivery_after_a_crash_counts_the_interrupted_attempt(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Before: the delivery after a crash said X-Relay-Attempt: 1 again,
    # though the receiver may have seen the first one (issue 40).
    # Counted, not spent: relay's own crash takes no retry from the receiver.
    sink, url = await start_sink([503])
    config = make_config(one_target(url), ROUTES, retry={"retries": 1})
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    event_id = await post(relay, http)
    # The attempt is under way when the process dies: its lease stays as it was.
    [claimed] = await relay.store.claim_due(clock.now(), clock.now() + 3600, {"crm": 1})
    await relay.stop()
    relay2 = await start_relay(config, background=False, clock=clock)
    await relay2.scheduler.drain()
    assert [r.headers["X-Relay-Attempt"] for r in sink.requests] == ["2", "3"]
    [delivery] = (await detail(relay2, event_id)).event.deliveries
    assert (delivery.id, delivery.status, delivery.attempts) == (claimed.id, Status.DEAD, 3)
