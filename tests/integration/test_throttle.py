"""A receiver's throttle: a 429 (or a status a target declares temporary)
holds the whole target, with or without a configured rate, spends no retry,
and lets it go again near the receiver's limit (relay.delivery.step, rule 4).

The receivers count requests by the injected clock, as their documentation
says they do. Before: a 429 without Retry-After slowed nothing (a target
paced at 7/s met 21 more inside the receiver's 3-second window, each
spending a retry), a Retry-After held only paced targets, and amoCRM's 403
while it blocks made every delivery sent into the block dead.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from aiohttp import web

from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import post_events

ROUTES = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}


class LimitedCrm:
    """A CRM that takes `per_second` requests in any second. Past it, it
    answers `status` (429; amoCRM's 403 once it blocks) until `block` seconds
    have passed since the request that went over, without a Retry-After.
    `quota_gone_at`: from the nth request taken, the quota is spent by
    another client for `block` seconds."""

    def __init__(
        self,
        clock: FakeClock,
        *,
        per_second: int = 7,
        block: float = 3.0,
        status: int = 429,
        quota_gone_at: int | None = None,
    ) -> None:
        self.clock = clock
        self.per_second, self.block, self.status = per_second, block, status
        self.quota_gone_at = quota_gone_at
        self.taken: list[tuple[float, str]] = []  # (when, Idempotency-Key)
        self.refused: list[float] = []
        self._window: deque[float] = deque()
        self._blocked_until = 0.0

    def answer(self, request: web.Request, number: int) -> web.StreamResponse:
        now = self.clock.now()
        if now < self._blocked_until:
            self.refused.append(now)
            return web.json_response({"title": "Too Many Requests"}, status=self.status)
        while self._window and self._window[0] <= now - 1.0:
            self._window.popleft()
        over = len(self._window) >= self.per_second
        if over or (self.quota_gone_at is not None and len(self.taken) == self.quota_gone_at):
            self.quota_gone_at = None
            self._blocked_until = now + self.block
            self.refused.append(now)
            return web.json_response({"title": "Too Many Requests"}, status=self.status)
        self._window.append(now)
        self.taken.append((now, request.headers["Idempotency-Key"]))
        return web.json_response({"id": len(self.taken)})

    def refused_within(self, start: float, seconds: float) -> int:
        return sum(1 for at in self.refused if start <= at < start + seconds)


async def run(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    crm: LimitedCrm,
    target: dict[str, Any],
    events: int,
) -> list[Any]:
    _sink, url = await start_sink(crm.answer)
    config = make_config({"crm": {"type": "http", "url": url, **target}}, ROUTES)
    relay = await start_relay(config, background=False, clock=crm.clock)
    await post_events(relay.ingress_url + "/hooks/orders", events)
    await relay.scheduler.drain()
    stored = await relay.store.list_events(EventQuery(limit=events))
    return [d for e in stored for d in e.deliveries]


def taken_once(crm: LimitedCrm, events: int) -> None:
    keys = [key for _, key in crm.taken]
    assert len(keys) == len(set(keys)) == events


async def test_a_429_without_retry_after_holds_a_paced_target_and_spends_nothing(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # amoCRM's limit, 7 a second (developers.kommo.com/docs/limitations), and
    # relay paced at it; another integration spends the quota for 3 seconds.
    clock = FakeClock()
    crm = LimitedCrm(clock, quota_gone_at=10, block=3.0)
    deliveries = await run(make_config, start_relay, start_sink, crm, {"rate": "7/s"}, 60)

    assert {d.status for d in deliveries} == {Status.DELIVERED}
    assert {d.attempts_in_cycle for d in deliveries} == {1}  # no retry spent
    taken_once(crm, 60)
    first = crm.refused[0]
    # Before: 21 more 429s inside the window. Now the first, and at most a
    # probe or two as the hold grows.
    assert crm.refused_within(first, 3.0) <= 3
    # Once the receiver takes requests again, relay sends at its pace again:
    # the 50 left after the episode go at 7/s, within a tenth.
    after = [at for at, _ in crm.taken if at > first]
    assert len(after) == 50
    assert (after[-1] - after[0]) <= 49 / 7 * 1.1


async def test_a_429_holds_a_target_without_a_rate_for_its_retry_after(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # RFC 9110 section 10.2.3: Retry-After is how long "the user agent ought
    # to wait before making a follow-up request". Before, a target without a
    # rate sent its other deliveries into the wait.
    clock = FakeClock()
    refused_at: list[float] = []
    taken: list[float] = []

    def crm(request: web.Request, number: int) -> web.StreamResponse:
        if number == 2:
            refused_at.append(clock.now())
            return web.Response(status=429, headers={"Retry-After": "5"})
        taken.append(clock.now())
        return web.Response(status=200)

    _sink, url = await start_sink(crm)
    config = make_config({"crm": {"type": "http", "url": url, "concurrency": 1}}, ROUTES)
    relay = await start_relay(config, background=False, clock=clock)
    await post_events(relay.ingress_url + "/hooks/orders", 6)
    await relay.scheduler.drain()
    [limited] = refused_at
    assert len(taken) == 6
    assert not [at for at in taken if limited < at < limited + 5]


async def test_a_429_without_a_rate_lets_few_more_through_per_window(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # No rate configured: relay sends as its concurrency allows, meets the
    # limit, and holds the target; what was in flight meets it too, nothing more.
    clock = FakeClock()
    crm = LimitedCrm(clock, per_second=7, block=1.0)
    deliveries = await run(make_config, start_relay, start_sink, crm, {"concurrency": 4}, 60)

    assert {d.status for d in deliveries} == {Status.DELIVERED}
    assert {d.attempts_in_cycle for d in deliveries} == {1}
    taken_once(crm, 60)
    for at in crm.refused:
        assert crm.refused_within(at, 1.0) <= 4  # the ones in flight, at most


async def test_amocrm_blocking_with_403_holds_a_target_that_declares_it_temporary(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # Kommo (amoCRM), developers.kommo.com/docs/limitations: past 7 requests
    # a second the address is blocked, and every request is answered 403
    # while the block lasts. A 403 is final for relay unless the target says
    # it is temporary for it.
    clock = FakeClock()
    crm = LimitedCrm(clock, per_second=7, block=10.0, status=403)
    deliveries = await run(
        make_config,
        start_relay,
        start_sink,
        crm,
        {"concurrency": 4, "temporary_statuses": [403]},
        30,
    )
    assert {d.status for d in deliveries} == {Status.DELIVERED}
    assert {d.attempts_in_cycle for d in deliveries} == {1}
    taken_once(crm, 30)
    assert crm.refused_within(crm.refused[0], 10.0) <= 6


async def test_without_temporary_statuses_amocrms_block_is_dead(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    # The default: a 403 says the request is refused, which no retry mends.
    clock = FakeClock()
    crm = LimitedCrm(clock, per_second=7, block=10.0, status=403)
    deliveries = await run(make_config, start_relay, start_sink, crm, {"concurrency": 4}, 30)
    assert Status.DEAD in {d.status for d in deliveries}
