"""The store contract: every verb of every role (relay.store.base), run
against every backend the `backend` fixture names (tests/store_backends.py).

A backend passes this suite unchanged. Real databases; time is passed in as
`now`, never read. Backend-specific behaviour (SQLite's WAL, its file
permissions, its group commit) is in that backend's own test file.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from relay.core.records import FRESH_PROBE_GAP
from relay.core.secrets import Masker
from relay.loader import parse_config
from relay.ops.search import documents, parse_search
from relay.store import (
    AttemptKind,
    AttemptRecord,
    Conflict,
    Dead,
    Delivered,
    DeliveryView,
    DownState,
    EventQuery,
    IndexSource,
    NewDelivery,
    NotFound,
    Resend,
    ResendLink,
    RetryAt,
    SearchProgress,
    Selection,
    Status,
    Store,
    Waits,
)
from relay.store.base import Shared

from helpers import Hold, record
from samples import T0, TWO, event

FAILED_ATTEMPT = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
OK_ATTEMPT = AttemptRecord(1, T0, 0.01, "success", 200)


async def test_accept_stores_event_and_one_delivery_per_target(store: Store) -> None:
    accepted = await store.accept_event(event("k1", body=b"\xff\x00raw"), TWO, T0)
    assert not accepted.duplicate
    detail = await store.get_event(accepted.event_id)
    assert detail is not None
    assert detail.payload.body == b"\xff\x00raw"  # bytes kept as they came
    assert list(detail.payload.headers) == [
        ("Content-Type", "application/json"),
        ("X-Dup", "1"),
        ("X-Dup", "2"),
    ]
    assert detail.payload.query == "x=1"
    assert [
        (d.target, d.status, d.attempts, d.next_attempt_at) for d in detail.event.deliveries
    ] == [("crm", Status.PENDING, 0, T0), ("audit", Status.PENDING, 0, T0)]


async def test_duplicate_key_on_the_same_route_creates_nothing(store: Store) -> None:
    first = await store.accept_event(event("k1"), TWO, T0)
    again = await store.accept_event(event("k1"), TWO, T0 + 5)
    other_route = await store.accept_event(event("k1", route="leads"), TWO, T0)
    assert again.duplicate
    assert again.event_id == first.event_id
    assert not other_route.duplicate
    assert len(await store.list_events(EventQuery())) == 2


async def test_duplicates_inside_one_group_commit(store: Store) -> None:
    results = await asyncio.gather(*(store.accept_event(event("same"), TWO, T0) for _ in range(20)))
    assert sum(not r.duplicate for r in results) == 1
    assert len({r.event_id for r in results}) == 1


async def test_a_resend_inside_a_group_commit_of_new_events_stores_each_new_one_once(
    store: Store,
) -> None:
    # The batch is first inserted as if every key were new; the stored key
    # makes that fail, and the batch is stored again knowing it. Nothing of
    # the failed try may remain: each new event once, with its two deliveries.
    first = await store.accept_event(event("held"), TWO, T0)
    keys = ["held", *(f"new-{n}" for n in range(30)), "held", None]
    results = await asyncio.gather(*(store.accept_event(event(k), TWO, T0) for k in keys))
    assert [r.duplicate for r in results] == [True] + [False] * 30 + [True, False]
    assert results[0].event_id == results[-2].event_id == first.event_id
    events = await store.list_events(EventQuery(limit=100))
    assert len(events) == 1 + 30 + 1
    assert len({e.id for e in events}) == len(events)
    assert all(len(e.deliveries) == 2 for e in events)
    assert sorted(e.idempotency_key or "" for e in events) == sorted(
        ["", "held", *(f"new-{n}" for n in range(30))]
    )


async def test_same_key_with_other_content_is_a_new_event_flagged_as_a_conflict(
    store: Store,
) -> None:
    first = await store.accept_event(event("k1", body=b'{"order": 1}'), TWO, T0)
    other = await store.accept_event(event("k1", body=b'{"order": 2}'), TWO, T0 + 1)
    assert not other.duplicate
    assert other.event_id != first.event_id
    assert other.conflict_of == first.event_id
    # A re-send of either one is a duplicate of that one, not a third event.
    again_first = await store.accept_event(event("k1", body=b'{"order": 1}'), TWO, T0 + 2)
    again_other = await store.accept_event(event("k1", body=b'{"order": 2}'), TWO, T0 + 3)
    assert (again_first.duplicate, again_first.event_id) == (True, first.event_id)
    assert (again_other.duplicate, again_other.event_id) == (True, other.event_id)
    third = await store.accept_event(event("k1", body=b'{"order": 3}'), TWO, T0 + 4)
    assert third.conflict_of == first.event_id
    listed = {e.id: e.conflict_of for e in await store.list_events(EventQuery(key="k1"))}
    assert listed == {
        first.event_id: None,
        other.event_id: first.event_id,
        third.event_id: first.event_id,
    }
    detail = await store.get_event(other.event_id)
    assert detail is not None
    assert detail.event.conflict_of == first.event_id
    assert detail.payload.body == b'{"order": 2}'
    assert len(detail.event.deliveries) == 2


async def test_canonically_equal_payloads_are_duplicates(store: Store) -> None:
    first = await store.accept_event(event("k", body=b'{"a": 1, "b": [1, 2]}'), TWO, T0)
    again = await store.accept_event(event("k", body=b'{ "b":[1,2],\n"a":1 }'), TWO, T0)
    assert again.duplicate
    assert again.event_id == first.event_id


async def test_a_refused_conflict_stores_nothing(store: Store) -> None:
    first = await store.accept_event(event("k", body=b"one"), TWO, T0)
    refused = await store.accept_event(event("k", body=b"two"), TWO, T0, refuse_conflict=True)
    assert refused.refused
    assert not refused.duplicate
    assert refused.conflict_of == first.event_id
    assert len(await store.list_events(EventQuery())) == 1
    resend = await store.accept_event(event("k", body=b"one"), TWO, T0, refuse_conflict=True)
    assert resend.duplicate
    assert not resend.refused


async def test_conflicts_inside_one_group_commit(store: Store) -> None:
    bodies = [b"a", b"b", b"a", b"c", b"b"] * 4
    results = await asyncio.gather(
        *(store.accept_event(event("same", body=body), TWO, T0) for body in bodies)
    )
    stored = {r.event_id for r in results if not r.duplicate}
    assert len(stored) == 3  # one event per different payload
    by_body: dict[bytes, set[int]] = {}
    for body, result in zip(bodies, results, strict=True):
        by_body.setdefault(body, set()).add(result.event_id)
    assert all(len(ids) == 1 for ids in by_body.values())
    assert sum(r.conflict_of is not None for r in results) == 2


async def test_claim_leases_due_deliveries_per_target_limit(store: Store) -> None:
    for i in range(5):
        await store.accept_event(event(f"k{i}"), TWO, T0)
    claimed = await store.claim_due(T0, T0 + 60, {"crm": 3})
    assert [c.target for c in claimed] == ["crm"] * 3
    assert all(c.attempts == 0 and c.payload.body == b'{"a": 1}' for c in claimed)
    # Leased deliveries are not claimed twice.
    again = await store.claim_due(T0, T0 + 60, {"crm": 10})
    assert len(again) == 2
    assert not {c.id for c in claimed} & {c.id for c in again}


async def test_not_due_yet_is_not_claimed(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    assert await store.claim_due(T0 - 1, T0 + 60, {"crm": 10}) == []
    assert await store.next_due(["crm", "audit"]) == {"crm": T0}
    assert await store.next_due(["audit"]) == {}


async def test_expired_lease_is_claimed_again(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    [first] = await store.claim_due(T0, T0 + 30, {"crm": 10})
    assert await store.claim_due(T0 + 29, T0 + 59, {"crm": 10}) == []
    assert await store.next_due(["crm"]) == {"crm": T0 + 30}
    [again] = await store.claim_due(T0 + 31, T0 + 61, {"crm": 10})
    assert again.id == first.id


async def test_record_attempt_transitions(store: Store) -> None:
    accepted = await store.accept_event(event(), [*TWO, NewDelivery("mail")], T0)
    claimed = {
        c.target: c for c in await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1, "mail": 1})
    }
    attempt = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503", b"busy")
    await record(store, claimed["crm"], attempt, RetryAt(T0 + 2), T0)
    await record(
        store, claimed["audit"], AttemptRecord(1, T0, 0.01, "success", 200), Delivered(), T0
    )
    await record(
        store,
        claimed["mail"],
        AttemptRecord(1, T0, 0.01, "fail", 400, "HTTP 400"),
        Dead("HTTP 400"),
        T0,
    )
    detail = await store.get_event(accepted.event_id)
    assert detail is not None
    by_target = {d.target: d for d in detail.event.deliveries}
    assert by_target["crm"].status is Status.PENDING
    assert by_target["crm"].next_attempt_at == T0 + 2
    assert by_target["crm"].attempts == 1
    assert by_target["crm"].last_error == "HTTP 503"
    assert by_target["audit"].status is Status.DELIVERED
    assert by_target["mail"].status is Status.DEAD
    assert detail.event.status is Status.DEAD
    log = detail.attempts[by_target["crm"].id]
    assert [(a.number, a.outcome, a.http_status, a.response, a.next_attempt_at) for a in log] == [
        (1, "retry", 503, b"busy", T0 + 2)
    ]


async def test_release_gives_a_lease_back_without_an_attempt_recover_counts_one(
    store: Store,
) -> None:
    await store.accept_event(event(), TWO, T0)
    claimed = await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1})
    await store.release([claimed[0].id], T0)
    # At a start: the other was under way when the process stopped (it may
    # have reached the receiver), so it counts; the released one never began.
    assert (await store.recover_orphans(T0)).taken_back == 1
    again = await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1})
    assert sorted(c.id for c in again) == sorted(c.id for c in claimed)
    attempts = {c.id: (c.attempts, c.attempts_in_cycle) for c in again}
    assert attempts == {claimed[0].id: (0, 0), claimed[1].id: (1, 0)}


async def test_list_events_filters_and_cursor(store: Store) -> None:
    for i in range(5):
        await store.accept_event(event(f"k{i}", at=T0 + i), [NewDelivery("crm")], T0 + i)
    await store.accept_event(
        event("skip", at=T0 + 9), [NewDelivery("crm", Status.SKIPPED, "no")], T0 + 9
    )
    newest_first = await store.list_events(EventQuery(limit=3))
    assert [e.idempotency_key for e in newest_first] == ["skip", "k4", "k3"]
    page2 = await store.list_events(EventQuery(limit=3, before_id=newest_first[-1].id))
    assert [e.idempotency_key for e in page2] == ["k2", "k1", "k0"]
    skipped = await store.list_events(EventQuery(status=Status.SKIPPED))
    assert [e.idempotency_key for e in skipped] == ["skip"]
    assert skipped[0].status is Status.SKIPPED
    assert [e.idempotency_key for e in await store.list_events(EventQuery(key="k2"))] == ["k2"]
    assert await store.list_events(EventQuery(target="audit")) == []
    assert len(await store.list_events(EventQuery(since=T0 + 3, until=T0 + 5))) == 2


async def test_a_target_goes_down_is_probed_without_spending_and_comes_up(
    store: Store,
) -> None:
    ids = []
    for i in range(3):
        accepted = await store.accept_event(event(f"k{i}", at=T0 + i), [NewDelivery("crm")], T0 + i)
        ids.append(accepted.event_id)
    now = T0 + 5
    failed = AttemptRecord(1, now, 0.01, "retry", 503, "HTTP 503")
    [first] = await store.claim_due(now, now + 60, {"crm": 1})
    streak = await record(store, first, failed, RetryAt(now + 10), now, Hold(2, now + 20))
    assert (streak.went_down, streak.down) == (False, False)
    [second] = await store.claim_due(now, now + 60, {"crm": 1})
    streak = await record(store, second, failed, RetryAt(now + 11), now, Hold(2, now + 20))
    assert (streak.went_down, streak.down) == (True, True)
    assert await store.down_targets() == {
        "crm": DownState(now, now + 20, 0, second.id, probed_at=now)
    }
    # Retry times mean nothing while down: deliveries line up by arrival.
    views = [await store.get_delivery(delivery_id) for delivery_id in (first.id, second.id)]
    assert [v.next_attempt_at for v in views if v is not None] == [T0, T0 + 1]
    # The next probe takes the first in line, and says so.
    assert (await store.target_states())["crm"].down == DownState(
        now, now + 20, 0, last_probe=second.id, next_probe=first.id, probed_at=now
    )

    # The probe is the oldest; failing, it spends no retry and goes to the back
    # of the line: the next probe is another delivery (one bad payload cannot
    # hold the target down).
    [probe] = await store.claim_due(now + 20, now + 80, {"crm": 1})
    assert probe.id == first.id
    streak = await record(
        store,
        probe,
        AttemptRecord(
            2,
            now + 20,
            0.01,
            "retry",
            None,
            "connection refused",
            kind=AttemptKind.PROBE,
        ),
        Waits(now + 60),
        now + 20,
        Hold(2, now + 60, probe=True),
    )
    assert streak.down
    assert await store.down_targets() == {
        "crm": DownState(now, now + 60, 1, first.id, probed_at=now + 20)
    }
    view = await store.get_delivery(first.id)
    assert view is not None
    assert (view.status, view.next_attempt_at, view.attempts, view.attempts_in_cycle) == (
        Status.PENDING,
        now + 60,  # the next probe's moment: after every delivery due by then
        2,
        1,
    )
    detail = await store.get_event(first.event_id)
    assert detail is not None
    assert [(a.kind, a.cycle_number) for a in detail.attempts[first.id]] == [
        (AttemptKind.CYCLE, 1),
        (AttemptKind.PROBE, None),
    ]

    # An answer about the payload (a 4xx) says the target is up.
    [probe] = await store.claim_due(now + 60, now + 120, {"crm": 1})
    assert probe.id == second.id
    streak = await record(
        store,
        probe,
        AttemptRecord(3, now + 60, 0.01, "fail", 422, "HTTP 422"),
        Dead("HTTP 422"),
        now + 60,
        Hold(2, now + 200, probe=True),
    )
    assert (streak.came_up, streak.waited, streak.down_for) == (True, 2, 60)
    assert await store.down_targets() == {}
    states = await store.target_states()
    assert states["crm"].down is None
    # Up again, the backlog lines up by arrival: the rotated probe first again.
    claims = await store.claim_due(now + 60, now + 120, {"crm": 5})
    assert [c.id for c in claims] == [first.id, first.id + 2]


async def test_a_target_going_down_lets_a_delivery_finish_its_backoff_before_a_probe(
    store: Store,
) -> None:
    # The first in line failed just before with a backoff that ends after the
    # first probe: the probe takes the next one, never sends it early.
    early = await store.accept_event(event("k0", at=T0), [NewDelivery("crm")], T0)
    await store.accept_event(event("k1", at=T0 + 1), [NewDelivery("crm")], T0 + 1)
    now = T0 + 5
    failed = AttemptRecord(1, now, 0.01, "retry", 503, "HTTP 503")
    [first] = await store.claim_due(now, now + 60, {"crm": 1})
    assert first.event_id == early.event_id
    await record(store, first, failed, RetryAt(now + 30), now, Hold(2, now + 20))
    [second] = await store.claim_due(now, now + 60, {"crm": 1})
    streak = await record(store, second, failed, RetryAt(now + 2), now, Hold(2, now + 20))
    assert streak.went_down
    views = [await store.get_delivery(delivery_id) for delivery_id in (first.id, second.id)]
    assert [v.next_attempt_at for v in views if v is not None] == [now + 30, T0 + 1]

    [probe] = await store.claim_due(now + 20, now + 80, {"crm": 1})
    assert probe.id == second.id
    probe_failed = AttemptRecord(
        2, now + 20, 0.01, "retry", 503, "HTTP 503", kind=AttemptKind.PROBE
    )
    next_probe = Hold(2, now + 60, probe=True)
    await record(store, probe, probe_failed, Waits(now + 60), now + 20, next_probe)
    # Its backoff over by the next probe, the first one is that probe.
    [probe] = await store.claim_due(now + 60, now + 120, {"crm": 1})
    assert probe.id == first.id


def held_when_down(store: Store) -> None:
    """A store that decides probes itself (a cluster's) is told which targets
    hold when down, as `relay serve` tells it from the config; the others
    are told at each claim (claim_due's `probes`)."""
    if isinstance(store, Shared):
        crm = {"type": "http", "url": "http://crm.invalid/", "hold_when_down": True}
        routes = {"orders": {"path": "/hooks/orders", "targets": ["crm"]}}
        config = {"targets": {"crm": crm}, "routes": routes}
        store.reconfigure(parse_config(config, {}, base=Path.cwd()))


async def test_a_delivery_that_arrives_while_its_target_is_down_is_its_next_probe(
    store: Store,
) -> None:
    # Down for two failures at T0 + 5, its first probe an hour on. A webhook
    # that arrives meanwhile is fresh evidence: due FRESH_PROBE_GAP after the
    # last probe at the soonest, taken before the older ones in line, and
    # evidence no more once a probe has gone after it.
    held_when_down(store)
    for i in range(2):
        await store.accept_event(event(f"k{i}", at=T0), [NewDelivery("crm")], T0)
    now = T0 + 5
    failed = AttemptRecord(1, now, 0.01, "retry", 503, "HTTP 503")
    for claim in await store.claim_due(now, now + 60, {"crm": 2}):
        await record(store, claim, failed, RetryAt(now + 2), now, Hold(2, now + 3600))
    down = (await store.down_targets())["crm"]
    assert (down.probed_at, down.evidence_at, down.due) == (now, None, now + 3600)

    arrived = now + 1
    fresh = await store.accept_event(event("k2", at=arrived), [NewDelivery("crm")], arrived)
    down = (await store.down_targets())["crm"]
    assert (down.evidence_at, down.due) == (arrived, now + FRESH_PROBE_GAP)
    state = (await store.target_states())["crm"].down
    assert state is not None
    [fresh_delivery] = [d for d in await deliveries(store) if d.event_id == fresh.event_id]
    assert state.next_probe == fresh_delivery.id  # what the event page says

    at = now + FRESH_PROBE_GAP
    [probe] = await store.claim_due(at, at + 60, {"crm": 1}, probes=["crm"])
    assert probe.id == fresh_delivery.id  # before the two lined up since T0
    if store.claims_probes:
        assert probe.probe is not None
    attempt = AttemptRecord(1, at, 0.01, "retry", 503, "HTTP 503", kind=AttemptKind.PROBE)
    await record(store, probe, attempt, Waits(at + 2), at, Hold(2, at + 2, probe=True))
    down = (await store.down_targets())["crm"]
    assert (down.probed_at, down.evidence_at, down.due) == (at, None, at + 2)
    # The next probe, on the backoff: the first in line again.
    [probe] = await store.claim_due(at + 2, at + 62, {"crm": 1}, probes=["crm"])
    assert probe.id != fresh_delivery.id


async def deliveries(store: Store) -> list[DeliveryView]:
    return [d for view in await store.list_events(EventQuery(limit=100)) for d in view.deliveries]


async def test_a_delivery_that_fails_while_others_succeed_never_makes_its_target_down(
    store: Store,
) -> None:
    # One poison payload among good ones: it fails, the others are delivered,
    # then it fails again and again on its own (after the others, nothing in
    # between). Its failures are its payload's: the target never goes down,
    # and its retries are spent as the scheduler decided (RetryAt, then Dead).
    for i in range(3):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    poison, *good = await store.claim_due(T0, T0 + 60, {"crm": 3})
    hold = Hold(2, T0 + 3600)
    streak = await record(store, poison, FAILED_ATTEMPT, RetryAt(T0 + 2), T0, hold)
    assert (streak.after, streak.went_down) == (1, False)
    for claim in good:
        await record(store, claim, OK_ATTEMPT, Delivered(), T0)
    for number, at in enumerate((T0 + 2, T0 + 6, T0 + 14), start=2):
        [again] = await store.claim_due(at, at + 60, {"crm": 3})
        attempt = AttemptRecord(number, at, 0.01, "retry", 503, "HTTP 503")
        streak = await record(store, again, attempt, RetryAt(at + 2**number), at, hold)
        assert (streak.went_down, streak.down) == (False, False)
    assert await store.down_targets() == {}
    [last] = await store.claim_due(T0 + 30, T0 + 90, {"crm": 3})
    await record(store, last, FAILED_ATTEMPT, Dead("HTTP 503 (gave up)"), T0 + 30, hold)
    view = await store.get_delivery(poison.id)
    assert view is not None
    assert (view.status, view.attempts_in_cycle) == (Status.DEAD, 5)
    assert await store.down_targets() == {}

    # A person's requeue is a fresh start: failing again, alone no more
    # (nothing was delivered since), its failures count towards down again.
    await store.requeue(Selection(ids=(poison.id,)), T0 + 31)
    [fresh] = await store.claim_due(T0 + 31, T0 + 91, {"crm": 3})
    streak = await record(store, fresh, FAILED_ATTEMPT, RetryAt(T0 + 33), T0 + 31, hold)
    assert (streak.went_down, streak.down) == (False, False)
    [again] = await store.claim_due(T0 + 33, T0 + 93, {"crm": 3})
    streak = await record(store, again, FAILED_ATTEMPT, RetryAt(T0 + 37), T0 + 33, hold)
    assert streak.went_down
    probe_at = (await store.down_targets())["crm"].probe_at
    [probe] = await store.claim_due(probe_at, probe_at + 60, {"crm": 1})
    await record(
        store, probe, OK_ATTEMPT, Delivered(), probe_at, Hold(2, probe_at + 60, probe=True)
    )
    assert await store.down_targets() == {}

    # Failures of different deliveries in a row still make it down.
    for i in range(2):
        await store.accept_event(event(f"m{i}"), [NewDelivery("crm")], T0 + 40)
    for claim in await store.claim_due(T0 + 40, T0 + 100, {"crm": 2}):
        streak = await record(
            store, claim, FAILED_ATTEMPT, RetryAt(T0 + 50), T0 + 40, Hold(2, T0 + 60)
        )
    assert streak.went_down


async def test_ordered_deliveries_wait_their_turn_in_one_batch_and_across_batches(
    store: Store,
) -> None:
    keyed = [NewDelivery("crm", order_key="A"), NewDelivery("audit")]
    # Two in one group commit, one later: only the first of key A is due.
    first, second = await asyncio.gather(
        store.accept_event(event("e1"), keyed, T0), store.accept_event(event("e2"), keyed, T0)
    )
    third = await store.accept_event(event("e3"), keyed, T0 + 1)
    other = await store.accept_event(event("e4"), [NewDelivery("crm", order_key="B")], T0 + 1)
    claimed = await store.claim_due(T0 + 5, T0 + 65, {"crm": 10})
    assert sorted(c.event_id for c in claimed) == sorted([first.event_id, other.event_id])
    assert await store.next_due(["crm"]) == {"crm": T0 + 65}  # the leases, nothing else due

    head = next(c for c in claimed if c.event_id == first.event_id)
    b = next(c for c in claimed if c.event_id == other.event_id)
    await record(store, b, AttemptRecord(1, T0 + 5, 0.01, "success", 200), Delivered(), T0)
    # It dies: the line holds, and says why.
    await record(
        store,
        head,
        AttemptRecord(1, T0 + 5, 0.01, "fail", 422, "HTTP 422"),
        Dead("HTTP 422"),
        T0 + 5,
    )
    assert await store.claim_due(T0 + 100, T0 + 160, {"crm": 10}) == []
    detail = await store.get_event(second.event_id)
    assert detail is not None
    waiting = next(d for d in detail.event.deliveries if d.target == "crm")
    assert waiting.held_behind is not None
    assert (waiting.held_behind.delivery_id, waiting.held_behind.status) == (head.id, Status.DEAD)
    with pytest.raises(Conflict, match="waiting its turn"):
        await store.retry_now(waiting.id, T0 + 100)
    # Counted for relay_deliveries_held: e2 and e3 wait behind the dead head.
    assert (await store.gauges()).held == {"crm": 2}

    # Skipped by a person: the next one goes (and only it).
    skipped = await store.skip(head.id, T0 + 200)
    assert skipped.status is Status.SKIPPED
    assert (await store.gauges()).held == {}
    [after] = await store.claim_due(T0 + 200, T0 + 260, {"crm": 10})
    assert after.id == waiting.id
    await record(
        store, after, AttemptRecord(1, T0 + 200, 0.01, "success", 200), Delivered(), T0 + 200
    )
    [last] = await store.claim_due(T0 + 200, T0 + 260, {"crm": 10})
    assert last.event_id == third.event_id
    with pytest.raises(Conflict):
        await store.skip(last.id, T0 + 200)  # in flight
    with pytest.raises(NotFound):
        await store.skip(10_000, T0 + 200)


# Search by content and corrected copies (relay.ops.search makes the documents).


async def test_search_index_follows_a_high_water_mark_and_finds_by_text_and_digits(
    store: Store,
) -> None:
    bodies = [
        b'{"name": "Anna", "phone": "+7 (999) 123-45-67"}',
        b'{"name": "Boris", "promo": "100%_off", "phone": "89990000000"}',
        b'{"name": "Anna Maria", "phone": "8 999 123 45 67"}',
    ]
    ids = [(await store.accept_event(event(body=b), TWO, T0)).event_id for b in bodies]
    assert await store.search_progress() == SearchProgress(indexed_through=0, newest=ids[-1])
    batch = await store.events_to_index(2, body_limit=10)
    assert [source.event_id for source in batch] == ids[:2]
    assert batch[0].body == bodies[0][:10]  # cut to the limit in the database
    assert ("X-Dup", "2") in batch[0].headers
    await store.index_events(documents(batch, Masker()), batch[-1].event_id)
    assert (await store.search_progress()).behind == 1
    rest = await store.events_to_index(10, body_limit=1000)
    assert [source.event_id for source in rest] == [ids[2]]
    await store.index_events(documents(rest, Masker()), ids[2])
    assert await store.events_to_index(10, body_limit=1000) == []

    # The first two were indexed from cut bodies: index them again, whole.
    whole = [
        IndexSource(i, [], "", "application/json", body)
        for i, body in zip(ids, bodies, strict=True)
    ]
    await store.index_events(documents(whole, Masker()), ids[-1])

    async def found(text: str, **filters: Any) -> list[int]:
        query = EventQuery(search=parse_search(text), **filters)
        return [view.id for view in await store.list_events(query)]

    assert await found("79991234567") == [ids[2], ids[0]]
    assert await found("ANNA") == [ids[2], ids[0]]
    assert await found("maria anna") == [ids[2]]
    assert await found("anna", limit=1) == [ids[2]]
    assert await found("anna", before_id=ids[2]) == [ids[0]]
    assert await found("anna", route="other") == []
    # % and _ are characters, not wildcards (both would match "boris" otherwise).
    assert await found("b%s") == []
    assert await found("bor_s") == []
    assert await found("100%_off") == [ids[1]]


async def test_what_the_indexer_is_on_is_kept_and_a_skipped_event_is_flagged(
    store: Store,
) -> None:
    # relay.background.indexer: said before it reads, known after a crash,
    # cleared once reached; an event skipped is flagged and never read again.
    ids = [(await store.accept_event(event(key=f"k{n}"), TWO, T0)).event_id for n in range(3)]
    assert await store.interrupted_indexing() is None
    await store.indexing_begins(ids[1])
    assert await store.interrupted_indexing() == ids[1]  # what a crash now leaves
    batch = await store.events_to_index(1, body_limit=10)
    await store.index_events(documents(batch, Masker()), ids[0])
    assert await store.interrupted_indexing() == ids[1]  # not reached yet
    await store.skip_indexing(ids[1], "relay stopped while reading it")
    assert await store.interrupted_indexing() is None
    assert [source.event_id for source in await store.events_to_index(10, 10)] == [ids[2]]
    [flagged] = await store.flagged_events(10)
    assert (flagged.id, flagged.flagged) == (ids[1], "relay stopped while reading it")
    assert (await store.gauges()).flagged == 1
    detail = await store.get_event(ids[1])
    assert detail is not None
    assert detail.event.flagged == "relay stopped while reading it"
    await store.indexing_begins(ids[2])
    await store.indexing_begins(None)  # a stop between pieces: on none
    assert await store.interrupted_indexing() is None


async def test_search_leaves_out_events_purged_meanwhile_and_purge_takes_index_rows(
    store: Store,
) -> None:
    done = [NewDelivery("crm", Status.SKIPPED)]
    first = (await store.accept_event(event(body=b'{"name": "Gone"}'), done, T0)).event_id
    batch = await store.events_to_index(10, body_limit=1000)
    assert await store.purge({}, T0 + 1, limit=10, dry_run=False) == 1
    await store.index_events(documents(batch, Masker()), first)  # too late: it is gone
    second = (await store.accept_event(event(body=b'{"name": "Gone"}'), done, T0 + 5)).event_id
    await store.index_events(
        documents(await store.events_to_index(10, body_limit=1000), Masker()), second
    )
    query = EventQuery(search=parse_search("gone"))
    assert [view.id for view in await store.list_events(query)] == [second]
    assert await store.purge({}, T0 + 10, limit=10, dry_run=False) == 1
    third = (await store.accept_event(event(body=b'{"name": "Gone"}'), done, T0 + 20)).event_id
    # The new event is not indexed yet; the purged one left the index with its row.
    assert await store.list_events(query) == []
    assert (await store.search_progress()).indexed_through == second < third


async def test_resend_stores_a_linked_copy_and_stops_the_originals_delivery_to_its_target(
    store: Store,
) -> None:
    original = (await store.accept_event(event("k-1"), TWO, T0)).event_id
    before = await store.get_event(original)
    resend = Resend(
        original_id=original,
        headers=(("X-Dup", "1"), ("Content-Type", "application/json")),
        body=b'{"a": 2}',
        content_type="application/json",
        targets=("crm",),
        by="cli user anna",
    )
    copy = await store.resend(resend, T0 + 60)
    assert copy > original
    detail = await store.get_event(copy)
    assert detail is not None
    assert detail.payload.body == b'{"a": 2}'
    assert detail.event.idempotency_key is None
    assert detail.payload.headers == [("X-Dup", "1"), ("Content-Type", "application/json")]
    assert [(d.target, d.status) for d in detail.event.deliveries] == [("crm", Status.PENDING)]
    assert detail.resent_from == ResendLink(original, copy, T0 + 60, "cli user anna")
    after = await store.get_event(original)
    assert after is not None
    assert before is not None
    assert after.resent_as == (ResendLink(original, copy, T0 + 60, "cli user anna"),)
    # The original's body and its delivery to audit are as they were; its
    # pending delivery to crm is superseded by the copy's, linked both ways.
    assert after.payload == before.payload
    crm, audit = after.event.deliveries
    [copy_crm] = detail.event.deliveries
    assert (crm.status, crm.resolved_by, crm.next_attempt_at) == (
        Status.SUPERSEDED,
        copy_crm.id,
        None,
    )
    assert copy_crm.resolves == crm.id
    assert audit == before.event.deliveries[1]
    assert [(e.kind, e.by) for e in after.log[crm.id]] == [("superseded", "cli user anna")]
    # Only the copy goes to crm: the original's pending delivery would be the
    # same lead a second time, under an identity of its own.
    claimed = await store.claim_due(T0 + 60, T0 + 120, {"crm": 10, "audit": 10})
    assert sorted((c.event_id, c.target) for c in claimed) == [
        (original, "audit"),
        (copy, "crm"),
    ]
    with pytest.raises(NotFound):
        await store.resend(dataclasses.replace(resend, original_id=9999), T0)
