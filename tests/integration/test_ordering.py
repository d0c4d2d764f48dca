"""Per-key ordering (`order_by`): a payment's statuses reach the CRM in the
order relay received them, whatever retries happen on the way.

Payloads are T-Bank notifications (tests/fixtures/tbank/, see its SOURCE.md);
a two-stage payment is notified AUTHORIZED, then CONFIRMED, for one OrderId.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.config import ConfigError
from relay.core.clock import FakeClock
from relay.store import Conflict, EventQuery, Selection, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tbank" / "notification-confirmed.json").read_text()
)


def notification(order: str, status: str, **extra: Any) -> dict[str, Any]:
    return {**FIXTURE, "OrderId": order, "Status": status, **extra}


def config_for(make_config: ConfigFactory, url: str, **target: Any) -> Any:
    return make_config(
        {"crm": {"type": "http", "url": url, "concurrency": 4, **target}},
        {
            "tbank": {
                "path": "/hooks/tbank",
                "targets": [{"target": "crm", "order_by": "{{ json.OrderId }}"}],
            }
        },
    )


async def post(relay: Relay, body: dict[str, Any]) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/tbank", json=body) as answer,
    ):
        assert answer.status == 200
        return int((await answer.json())["id"])


class Crm:
    """Records what arrives; answers by a rule over (OrderId, Status) and how
    many times that notification has been seen."""

    def __init__(self, rule: Any, clock: FakeClock | None = None) -> None:
        self.rule = rule
        self.clock = clock
        self.times: list[float] = []  # clock time of each request, with a clock
        self.arrived: list[tuple[str, str, int]] = []  # (OrderId, Status, HTTP status)
        self.in_flight: dict[str, int] = {}
        self.overlaps = 0

    async def __call__(self, request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        order, status = body["OrderId"], body["Status"]
        if self.clock is not None:
            self.times.append(self.clock.now())
        seen = sum(1 for o, s, _ in self.arrived if (o, s) == (order, status))
        self.in_flight[order] = self.in_flight.get(order, 0) + 1
        if self.in_flight[order] > 1:
            self.overlaps += 1
        try:
            answer = self.rule(order, status, seen)
            self.arrived.append((order, status, answer))
            return web.Response(status=answer, text=str(answer))
        finally:
            self.in_flight[order] -= 1

    def delivered(self, order: str | None = None) -> list[str | tuple[str, str]]:
        return [
            s if order else (o, s)
            for o, s, code in self.arrived
            if code == 200 and (order is None or o == order)
        ]


async def test_a_retried_status_is_not_overtaken_and_other_keys_go_meanwhile(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # The first AUTHORIZED of each order fails once: without ordering, its
    # CONFIRMED (received later, never failing) would reach the CRM first.
    crm = Crm(lambda order, status, seen: 503 if status == "AUTHORIZED" and seen == 0 else 200)
    _, url = await start_sink(crm)
    relay = await start_relay(config_for(make_config, url), background=False, clock=FakeClock())
    for order in ("A-1", "B-2", "C-3"):
        await post(relay, notification(order, "AUTHORIZED"))
        await post(relay, notification(order, "CONFIRMED"))
    await post(relay, notification("D-4", "CONFIRMED"))
    await relay.scheduler.drain()

    for order in ("A-1", "B-2", "C-3"):
        assert crm.delivered(order) == ["AUTHORIZED", "CONFIRMED"]
    assert crm.overlaps == 0  # one at a time per key
    # Other keys went meanwhile: D-4 arrived before any AUTHORIZED was retried.
    first_retry = next(i for i, (o, s, _) in enumerate(crm.arrived) if s == "AUTHORIZED" and i >= 3)
    assert crm.arrived.index(("D-4", "CONFIRMED", 200)) < first_retry
    # A CONFIRMED that waited for its AUTHORIZED spent no retries: one attempt.
    for view in await relay.store.list_events(EventQuery(route="tbank")):
        [delivery] = view.deliveries
        assert delivery.status is Status.DELIVERED
        assert delivery.attempts == (2 if delivery.id in (1, 3, 5) else 1)


async def test_a_dead_delivery_holds_its_key_until_skipped(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # The CRM refuses A-1's AUTHORIZED for good (a 4xx about the payload).
    crm = Crm(lambda order, status, seen: 422 if (order, status) == ("A-1", "AUTHORIZED") else 200)
    _, url = await start_sink(crm)
    relay = await start_relay(config_for(make_config, url), background=False, clock=FakeClock())
    first = await post(relay, notification("A-1", "AUTHORIZED"))
    second = await post(relay, notification("A-1", "CONFIRMED"))
    third = await post(relay, notification("A-1", "REFUNDED"))
    await post(relay, notification("B-2", "CONFIRMED"))
    await relay.scheduler.drain()
    assert crm.delivered() == [("B-2", "CONFIRMED")]

    # The ones behind say what holds them, and a retry of theirs is refused.
    waiting = await relay.store.get_delivery(second)
    assert waiting is not None
    assert waiting.status is Status.PENDING
    assert waiting.held_behind is not None
    assert (waiting.held_behind.delivery_id, waiting.held_behind.status) == (first, Status.DEAD)
    async with http.get(f"{relay.admin_url}/api/v1/events/{second}") as answer:
        [view] = (await answer.json())["deliveries"]
    assert view["note"].startswith(f"held behind delivery {first}, dead")
    with pytest.raises(Conflict, match=f"behind delivery {first}"):
        await relay.store.retry_now(third, relay.clock.now())
    await relay.scheduler.drain()
    assert crm.delivered("A-1") == []

    # The operator skips the dead one: the rest of its key goes, in order.
    async with http.post(f"{relay.admin_url}/api/v1/deliveries/{first}/skip", json={}) as answer:
        assert answer.status == 200
        assert (await answer.json())["delivery"]["status"] == "skipped"
    await relay.scheduler.drain()
    assert crm.delivered("A-1") == ["CONFIRMED", "REFUNDED"]
    detail = await relay.store.get_event(first)
    assert detail is not None
    [skipped] = detail.event.deliveries
    assert skipped.status is Status.SKIPPED
    assert skipped.last_error == "skipped by an operator (was dead)"
    assert [(e.kind, e.detail) for e in detail.log[first]] == [
        ("skip", "not to be sent (was dead)")
    ]
    # Skipping again is refused: it is not pending or dead any more.
    async with http.post(f"{relay.admin_url}/api/v1/deliveries/{first}/skip", json={}) as answer:
        assert answer.status == 409


async def test_a_requeued_dead_delivery_goes_first(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    refusing = {"on": True}
    crm = Crm(lambda order, status, seen: 422 if refusing["on"] and status == "AUTHORIZED" else 200)
    _, url = await start_sink(crm)
    relay = await start_relay(config_for(make_config, url), background=False, clock=FakeClock())
    first = await post(relay, notification("A-1", "AUTHORIZED"))
    await post(relay, notification("A-1", "CONFIRMED"))
    await relay.scheduler.drain()
    refusing["on"] = False  # the CRM's field mapping was fixed
    await relay.console.requeue(Selection(ids=(first,)), by="test")
    await relay.scheduler.drain()
    assert crm.delivered("A-1") == ["AUTHORIZED", "CONFIRMED"]


async def test_a_lease_lost_mid_attempt_does_not_let_the_next_overtake(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    crm = Crm(lambda order, status, seen: 200)
    _, url = await start_sink(crm)
    clock = FakeClock()
    config = config_for(make_config, url)
    relay = await start_relay(config, background=False, clock=clock)
    first = await post(relay, notification("A-1", "AUTHORIZED"))
    await post(relay, notification("A-1", "CONFIRMED"))
    # Another process claimed the first and died mid-attempt (kill -9): its
    # lease runs until it expires, and the second must wait for it.
    [claimed] = await relay.store.claim_due(clock.now(), clock.now() + 70, {"crm": 1})
    assert claimed.id == first
    assert await relay.scheduler.run_once() == 0
    await relay.scheduler.drain()  # jumps past the lease: the first goes, then the second
    assert crm.delivered("A-1") == ["AUTHORIZED", "CONFIRMED"]


async def test_ordering_with_a_target_down_and_a_rate(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    clock = FakeClock()
    back_at = clock.now() + 3 * 3600
    crm = Crm(lambda order, status, seen: 503 if clock.now() < back_at else 200, clock)
    _, url = await start_sink(crm)
    config = config_for(make_config, url, hold_when_down=True, down_after=2, rate="2/s")
    relay = await start_relay(config, background=False, clock=clock)
    for status in ("NEW", "AUTHORIZED", "CONFIRMED"):
        for order in ("A-1", "B-2"):
            await post(relay, notification(order, status))
    await relay.scheduler.drain()
    for order in ("A-1", "B-2"):
        assert crm.delivered(order) == ["NEW", "AUTHORIZED", "CONFIRMED"]
    assert crm.overlaps == 0
    stats = await relay.store.stats()
    assert stats.dead == 0
    # While down only the heads were ever tried: the probes and the two that made it down.
    assert {s for o, s, code in crm.arrived if code == 503} == {"NEW"}
    # The rate held once it was back: 2/s is one send every 0.5 s, no burst.
    after = [at for at in crm.times if at >= back_at]
    assert len(after) == 6
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(after))


def test_order_by_cannot_read_the_event_id(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r"order_by"):
        make_config(
            {"crm": {"type": "http", "url": "http://x.example/"}},
            {"r": {"path": "/r", "targets": [{"target": "crm", "order_by": "{{ event.id }}"}]}},
        )
