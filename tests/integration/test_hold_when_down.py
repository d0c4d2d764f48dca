"""hold_when_down: a target down for a long time costs no retries and no dead letters.

Everything runs against a real SQLite file and a real local HTTP target on
an injected clock: a 30-hour outage passes in well under a second.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relay.app import Relay
from relay.config import ConfigError, RetryPolicy
from relay.core.clock import FakeClock
from relay.core.records import FRESH_PROBE_GAP
from relay.delivery.retry import delay_before_retry
from relay.store import AttemptKind, EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import relay_cli, write_config

HOUR = 3600.0
ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
ALERTS = {"target": "ops"}


def targets(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "crm": {
            "type": "http",
            "url": url,
            "hold_when_down": True,
            "down_after": 3,
            "concurrency": 1,
            **extra,
        },
        "ops": {"type": "file", "path": "alerts.jsonl"},
    }


async def post(relay: Relay, n: int, **fields: Any) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(relay.ingress_url + "/hooks/orders", json={"n": n, **fields}) as answer,
    ):
        assert answer.status == 200
        return int((await answer.json())["id"])


Script = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


class Crm:
    """A CRM that is unreachable in effect (503) until `back_at`, then answers;
    it rejects a payload marked bad with 422, as a CRM rejects a bad field."""

    def __init__(self, clock: FakeClock, back_at: float) -> None:
        self.clock = clock
        self.back_at = back_at
        self.seen: list[tuple[float, int, int]] = []  # (clock time, n, status)
        self.on_request: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        now = self.clock.now()
        if now < self.back_at:
            status = 503
        elif body.get("bad"):
            status = 422
        else:
            status = 200
        self.seen.append((now, body["n"], status))
        if self.on_request is not None:
            await self.on_request()
        return web.Response(status=status, text=f"{status}")


async def alert_bodies(relay: Relay) -> list[dict[str, Any]]:
    """Alerts created so far (the alert path's own events), oldest first."""
    bodies = []
    for view in await relay.store.list_events(EventQuery(route="_alerts", limit=100)):
        detail = await relay.store.get_event(view.id)
        assert detail is not None
        bodies.append(json.loads(detail.payload.body))
    return list(reversed(bodies))


def probe_times(went_down: float, count: int, policy: RetryPolicy) -> list[float]:
    """When probes go: the target's backoff, its last delay repeating."""
    times, at = [], went_down
    for number in range(1, count + 1):
        at += delay_before_retry(policy, min(number, policy.retries))
        times.append(at)
    return times


async def test_a_30_hour_outage_loses_nothing_and_delivers_the_backlog_in_order(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    clock = FakeClock()
    start = clock.now()
    crm = Crm(clock, back_at=start + 30 * HOUR)
    _, url = await start_sink(crm)
    config = make_config(targets(url), ROUTES, alerts=ALERTS)
    relay = await start_relay(config, background=False, clock=clock)
    for n in range(6):
        await post(relay, n)

    # Ten hours into the outage three more orders arrive; an alert is sent then.
    async def mid_outage() -> None:
        if clock.now() >= start + 10 * HOUR and crm.on_request is not None:
            crm.on_request = None
            await relay.alerter.flush()
            for n in (100, 101, 102):
                await post(relay, n)

    crm.on_request = mid_outage
    await relay.scheduler.drain()
    await relay.alerter.flush()
    await relay.scheduler.drain()

    failed = [(at, n) for at, n, status in crm.seen if status == 503]
    delivered = [n for _, n, status in crm.seen if status == 200]
    # Three failures in a row made it down; then only probes, each by the
    # delivery first in line, a failed one going to the back: one bad payload
    # cannot be the probe for ever.
    assert [n for _, n in failed[:3]] == [0, 1, 2]
    probes = failed[3:]
    assert [n for _, n in probes[:6]] == [0, 1, 2, 3, 4, 5]
    assert all(a != b for (_, a), (_, b) in itertools.pairwise(probes))
    assert [at for at, _ in probes] == probe_times(start, len(probes), config.targets["crm"].retry)
    # After the outage: the probe that found the CRM up, then everything else
    # oldest first, none twice.
    everything = [0, 1, 2, 3, 4, 5, 100, 101, 102]
    assert delivered[1:] == [n for n in everything if n != delivered[0]]
    stats = await relay.store.stats()
    assert stats.dead == 0
    assert stats.counts_by_target["crm"] == {Status.DELIVERED: 9}
    assert stats.targets["crm"].down is None
    # Waiting spent no retries: at most the one failure before the target was down.
    for view in await relay.store.list_events(EventQuery(route="orders")):
        [delivery] = view.deliveries
        assert delivery.attempts_in_cycle <= 2, delivery
    down_alert, up_alert = [a for a in await alert_bodies(relay) if a["down"] or a["up"]]
    assert down_alert["down"][0]["target"] == "crm"
    assert "target crm is down" in down_alert["summary"]
    assert up_alert["up"] == [
        {"target": "crm", "waited": 8, "down_seconds": up_alert["up"][0]["down_seconds"]}
    ]
    assert up_alert["up"][0]["down_seconds"] >= 30 * HOUR
    assert "8 waiting deliveries" in up_alert["text"]


async def test_no_probe_sends_a_delivery_again_before_its_own_backoff_is_over(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # The operator's outage check: a delivery that failed twice just before
    # the target went down waits 4 s for its third try; the target's first
    # probe comes 2 s after it went down. The probe takes another delivery
    # rather than send that one 1 s before its backoff is over.
    clock = FakeClock()
    start = clock.now()
    crm = Crm(clock, back_at=start + 9)
    _, url = await start_sink(crm)
    config = make_config(targets(url, retry={"jitter": 0}), ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    policy = config.targets["crm"].retry

    async def turn(at: float) -> None:
        clock.set(start + at)
        await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()

    await post(relay, 0)
    await turn(0)
    await turn(delay_before_retry(policy, 1))  # 2: its second failure, the third at 6
    clock.set(start + 3)
    await post(relay, 1)
    await turn(3)  # the third failure in a row: down, the first probe at 5
    assert (await relay.store.down_targets())["crm"].probe_at == start + 5
    await turn(5)  # the probe: order 1, lined up; order 0 is not due before 6
    await relay.scheduler.drain()

    tries: dict[int, list[float]] = {}
    for at, n, _ in crm.seen:
        tries.setdefault(n, []).append(at - start)
    assert tries[0][:3] == [0, 2, 9]
    assert tries[1][:2] == [3, 5]
    # Every delivery's tries are at least its backoff apart: the policy's
    # before the target went down, the probes' after.
    for times in tries.values():
        for number, (before, after) in enumerate(itertools.pairwise(times), start=1):
            assert after - before >= delay_before_retry(policy, number), (times, number)
    assert [n for _, n, status in crm.seen if status == 200] == [0, 1]
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DELIVERED: 2}


async def test_a_payload_the_target_rejects_kills_only_its_own_delivery(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    clock = FakeClock()
    start = clock.now()
    crm = Crm(clock, back_at=start + 2 * HOUR)
    _, url = await start_sink(crm)
    relay = await start_relay(make_config(targets(url), ROUTES), background=False, clock=clock)
    # One is a payload the CRM refuses: whether it is the probe that finds the
    # CRM up (an answer about the payload says the target is up) or comes after, it
    # alone is dead.
    await post(relay, 0, bad=True)
    for n in range(1, 5):
        await post(relay, n)
    await relay.scheduler.drain()
    after = [(n, status) for at, n, status in crm.seen if at >= start + 2 * HOUR]
    assert sorted(after) == [(0, 422), (1, 200), (2, 200), (3, 200), (4, 200)]
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DEAD: 1, Status.DELIVERED: 4}
    assert stats.targets["crm"].down is None

    # While it is up, a 4xx is about the payload, not the target: never down.
    for n in range(10, 16):
        await post(relay, n, bad=n % 2 == 0)
    await relay.scheduler.drain()
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DEAD: 4, Status.DELIVERED: 7}
    assert stats.targets["crm"].down is None


async def test_down_state_survives_a_restart_and_respects_a_pause(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    start = clock.now()
    crm = Crm(clock, back_at=start + HOUR)
    _, url = await start_sink(crm)
    config = make_config(targets(url), ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    for n in range(4):
        await post(relay, n)
    assert await relay.scheduler.run_once() == 1
    await relay.scheduler.wait_idle()
    assert await relay.scheduler.run_once() == 1
    await relay.scheduler.wait_idle()
    assert await relay.scheduler.run_once() == 1
    await relay.scheduler.wait_idle()
    down = (await relay.store.down_targets())["crm"]
    assert down.probe_at == start + 2
    await relay.stop()

    # A new process reads the down state from the store: nothing goes before the probe.
    relay = await start_relay(config, background=False, clock=clock)
    assert await relay.scheduler.run_once() == 0
    assert "crm" in relay.scheduler.down
    async with http.get(relay.admin_url + "/metrics") as answer:
        assert 'relay_target_down{target="crm"} 1.0' in await answer.text()
    async with http.get(relay.admin_url + "/api/v1/targets") as answer:
        [view] = [t for t in (await answer.json())["targets"] if t["name"] == "crm"]
    assert view["down"] is True
    assert view["failed_probes"] == 0
    assert view["deliveries"]["pending"] == 4
    async with http.get(relay.admin_url + "/api/v1/stats") as answer:
        crm_stats = (await answer.json())["targets"]["crm"]  # what `relay stats` shows
    assert crm_stats["down"] is True
    assert crm_stats["down_since"] is not None
    assert crm_stats["next_probe_at"] is not None
    # Which delivery the next probe takes (the first in line), and which made it down.
    first_in_line = min(d.id for d in await _pending(relay))
    assert crm_stats["probe_delivery"] == view["probe_delivery"] == str(first_in_line)
    assert crm_stats["last_probe_delivery"] == str(first_in_line + 2)
    # Each waiting delivery's event says so, and which one the next probe is.
    probes = {}
    for delivery in await _pending(relay):
        async with http.get(f"{relay.admin_url}/api/v1/events/{delivery.event_id}") as answer:
            [shown] = (await answer.json())["deliveries"]
        probes[delivery.id] = shown["probe"]["is_next_probe"]
    assert probes == {d: d == first_in_line for d in probes}
    # relay show says it too.
    cli = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": targets(url),
            "routes": ROUTES,
        },
    )
    [first] = [d for d in await _pending(relay) if d.id == first_in_line]
    shown = relay_cli("show", str(first.event_id), "--config", str(cli)).stdout
    assert "target crm is down since" in shown
    assert "this delivery is its next probe" in shown

    # Paused, a down target is not even probed, however late it gets.
    await relay.console.set_paused("crm", True, by="test")
    clock.set(start + 10)
    assert await relay.scheduler.run_once() == 0
    await relay.console.set_paused("crm", False, by="test")
    assert await relay.scheduler.run_once() == 1  # the probe, alone
    await relay.scheduler.wait_idle()
    next_probe = (await relay.store.down_targets())["crm"].probe_at
    assert next_probe == start + 10 + 4  # probe 2 follows the backoff
    # Resuming a down target probes it at once, to check a fix without waiting.
    clock.set(start + 11)
    await relay.console.set_paused("crm", True, by="test")
    await relay.console.set_paused("crm", False, by="test")
    assert await relay.scheduler.run_once() == 1
    await relay.scheduler.wait_idle()
    await relay.scheduler.drain()
    # The successful probe (the third in line: two failed probes went to the
    # back), then the rest oldest first.
    assert [n for _, n, status in crm.seen if status == 200] == [2, 0, 1, 3]
    assert await relay.store.down_targets() == {}


async def _pending(relay: Relay) -> list[Any]:
    events = await relay.store.list_events(EventQuery(route="orders", status=Status.PENDING))
    return [d for view in events for d in view.deliveries]


def test_down_after_needs_hold_when_down(make_config: ConfigFactory) -> None:
    with pytest.raises(ConfigError, match=r"targets\.crm\.down_after"):
        make_config({"crm": {"type": "http", "url": "http://x.example/", "down_after": 2}}, ROUTES)


async def test_one_poison_payload_among_100_dies_on_its_own_schedule_and_holds_nothing_back(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # A CRM that is fine but never answers one large order in time (the
    # week's "large orders timed out" at the CRM): a timeout is a "target may
    # be down" failure, yet only that payload ever gets it.
    clock = FakeClock()
    start = clock.now()
    seen: list[tuple[float, int]] = []

    async def crm(request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        seen.append((clock.now(), body["n"]))
        if body.get("poison"):
            await asyncio.sleep(5)  # far past the attempt's time limit
        return web.Response(text="ok")

    _, url = await start_sink(crm)
    config = make_config(targets(url, retry={"timeout": "50ms"}), ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    ids = {n: await post(relay, n, poison=n == 50) for n in range(100)}
    # Bounded: before the fix the poison became the down target's only probe
    # and drain never ended.
    await asyncio.wait_for(relay.scheduler.drain(), 20)

    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DELIVERED: 99, Status.DEAD: 1}
    assert stats.targets["crm"].down is None
    assert sorted(n for _, n in seen if n != 50) == [n for n in range(100) if n != 50]
    # The poison spent its own schedule, every retry: 2 s, 4 s, … 2^15 s.
    policy = config.targets["crm"].retry
    expected, at = [start], start
    for retry in range(1, policy.retries + 1):
        at += delay_before_retry(policy, retry)
        expected.append(at)
    assert [at for at, n in seen if n == 50] == expected
    detail = await relay.store.get_event(ids[50])
    assert detail is not None
    [poison] = detail.event.deliveries
    assert (poison.status, poison.attempts, poison.attempts_in_cycle) == (Status.DEAD, 16, 16)
    assert poison.last_error is not None
    assert "gave up after 16 attempts" in poison.last_error
    attempts = detail.attempts[poison.id]
    assert [a.cycle_number for a in attempts] == list(range(1, 17))
    assert {a.kind for a in attempts} == {AttemptKind.CYCLE}


async def test_a_lead_arriving_at_a_quiet_target_held_down_by_a_poison_probes_it_at_once(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # A quiet target, one lead the CRM always refuses with a 503 (retryable):
    # its failures in a row make the target down, and it is the only probe
    # all night, its backoff growing. The next good lead is fresh evidence:
    # it is the next probe within FRESH_PROBE_GAP, not at the next probe of
    # the grown backoff; it goes through, and the poison then fails alone,
    # spending its own retries until it is dead.
    clock = FakeClock()
    seen: list[tuple[float, int, int]] = []

    async def crm(request: web.Request, number: int) -> web.StreamResponse:
        body = json.loads(await request.read())
        status = 503 if body.get("poison") else 200
        seen.append((clock.now(), body["n"], status))
        return web.Response(status=status)

    _, url = await start_sink(crm)
    config = make_config(targets(url), ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    poison = await post(relay, 0, poison=True)

    async def turn() -> int:
        started = await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()
        return started

    # The night: its own three failures make the target down, then probes
    # (each the poison, the only one) until they are 17 minutes apart.
    async def poison_due() -> float:
        detail = await relay.store.get_event(poison)
        assert detail is not None
        due = detail.event.deliveries[0].next_attempt_at
        assert due is not None
        return due

    while not await relay.store.down_targets():
        clock.set(await poison_due())
        assert await turn() == 1
    while True:
        down = (await relay.store.down_targets())["crm"]
        if down.probe_at - clock.now() > 1000:
            break
        clock.set(max(down.probe_at, await poison_due()))
        assert await turn() == 1
    assert [n for _, n, _ in seen] == [0] * len(seen)
    next_probe = down.probe_at

    # A lead in the morning, a second after that probe: it goes as soon as
    # probes may follow each other (at most one every few seconds).
    probed = seen[-1][0]
    clock.set(probed + 1)
    await post(relay, 1)
    assert await turn() == 0
    clock.set(probed + FRESH_PROBE_GAP)
    assert await turn() == 1
    assert seen[-1] == (probed + FRESH_PROBE_GAP, 1, 200)
    assert clock.now() < next_probe - 900
    assert await relay.store.down_targets() == {}

    # Up again, the poison fails alone: its own retries, then dead.
    await relay.scheduler.drain()
    detail = await relay.store.get_event(poison)
    assert detail is not None
    [delivery] = detail.event.deliveries
    assert (delivery.status, delivery.attempts_in_cycle) == (Status.DEAD, 16)
    assert "gave up after 16 attempts" in (delivery.last_error or "")
    assert await relay.store.down_targets() == {}
    assert [n for _, n, status in seen if status == 200] == [1]


async def test_while_down_under_a_stream_of_webhooks_probes_go_every_few_seconds(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # The CRM is really down, and leads keep coming, one a second: each
    # probe is a lead that arrived since the last one, never more than one
    # probe every few seconds; the backoff starts again each time, so the
    # CRM is found back within seconds of its return.
    clock = FakeClock()
    start = clock.now()
    crm = Crm(clock, back_at=start + 120)
    _, url = await start_sink(crm)
    relay = await start_relay(make_config(targets(url), ROUTES), background=False, clock=clock)
    for n in range(180):
        clock.set(start + n)
        await post(relay, n)
        await relay.scheduler.run_once()
        await relay.scheduler.wait_idle()
    probes = [at for at, _, status in crm.seen[3:] if at < start + 120]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps
    assert min(gaps) >= 2  # the backoff's first step
    assert max(gaps) <= FRESH_PROBE_GAP
    back = next(at for at, _, status in crm.seen if status == 200)
    assert back - (start + 120) <= FRESH_PROBE_GAP
    await relay.scheduler.drain()
    stats = await relay.store.stats()
    assert stats.counts_by_target["crm"] == {Status.DELIVERED: 180}
