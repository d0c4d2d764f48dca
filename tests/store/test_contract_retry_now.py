"""Store contract: a retry now by filter (retry_selected), the waiting backlog
sent now: each a person's retry (its count kept, no new cycle), a line's
waiting ones left to their turn, a paused target refused, a down one probed,
a receiver's hold said. Runs over every backend (tests/store_backends.py)."""

from __future__ import annotations

import functools

import pytest

from relay.config import RetryPolicy
from relay.core.outcome import Outcome
from relay.delivery.step import Attempted, Rules, step
from relay.store import (
    AttemptRecord,
    Conflict,
    Dead,
    DownState,
    NewDelivery,
    RetriedNow,
    RetryAt,
    Selection,
    Status,
    Store,
)

from helpers import Hold, record
from samples import T0, event

FAILED = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
WAITING = Selection(status=Status.PENDING, target="crm", sendable=True)


async def _backlog(store: Store, count: int, target: str = "crm") -> list[int]:
    """`count` deliveries to `target`, each failed once and waiting an hour for its retry."""
    for n in range(count):
        await store.accept_event(event(f"{target}{n}"), [NewDelivery(target)], T0)
    claims = await store.claim_due(T0, T0 + 60, {target: count})
    for claim in claims:
        await record(store, claim, FAILED, RetryAt(T0 + 3600), T0)
    return [claim.id for claim in claims]


async def test_the_waiting_backlog_goes_now_each_as_a_persons_retry(store: Store) -> None:
    waiting = await _backlog(store, 3)
    await _backlog(store, 1, "mail")  # another target's: not taken
    # A line: its head waits for its retry, the next one for its turn.
    for n in range(2):
        await store.accept_event(event(f"o{n}"), [NewDelivery("crm", order_key="A")], T0 + n)
    [head] = await store.claim_due(T0 + 5, T0 + 65, {"crm": 5})
    await record(store, head, FAILED, RetryAt(T0 + 3600), T0 + 5)
    planned = await store.select(WAITING, 100)
    assert planned == sorted([*waiting, head.id])
    assert await store.count(WAITING) == 4  # the dry run: what the action takes

    done = await store.retry_selected(WAITING, T0 + 10, by="cli user anna")
    assert done == RetriedNow(planned)
    claims = await store.claim_due(T0 + 10, T0 + 70, {"crm": 10, "mail": 10})
    assert sorted(c.id for c in claims) == planned  # the line's second still waits
    # Each is a person's retry: a failure returns it to its schedule, no
    # retry of its cycle spent, the count of its attempts kept.
    for claim in claims:
        assert (claim.manual, claim.resume_status, claim.resume_at) == (
            True,
            Status.PENDING,
            T0 + 3600,
        )
        assert (claim.attempts, claim.attempts_in_cycle) == (1, 1)
    failed = AttemptRecord(2, T0 + 10, 0.01, "retry", 503, "HTTP 503")
    await record(store, claims[0], failed, RetryAt(T0 + 3600), T0 + 10)
    back = await store.get_delivery(claims[0].id)
    assert back is not None
    assert (back.status, back.next_attempt_at, back.attempts_in_cycle) == (
        Status.PENDING,
        T0 + 3600,
        1,
    )
    detail = await store.get_event(back.event_id)
    assert detail is not None
    assert [(e.kind, e.by) for e in detail.log[back.id]] == [("retry", "cli user anna")]
    [entry] = await store.list_audit(1)
    assert (entry.action, entry.subject, entry.count) == ("retry", "pending, target crm", 4)


async def test_dead_ones_get_one_more_attempt_and_stay_dead_if_it_fails(store: Store) -> None:
    await store.accept_event(event("d"), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, FAILED, Dead("HTTP 503 too long"), T0)
    dead = Selection(status=Status.DEAD, target="crm", sendable=True)
    assert (await store.retry_selected(dead, T0 + 5)).ids == [claim.id]
    [again] = await store.claim_due(T0 + 5, T0 + 65, {"crm": 1})
    assert (again.manual, again.resume_status) == (True, Status.DEAD)
    assert (await store.retry_selected(Selection(status=Status.DELIVERED), T0 + 6)).ids == []


async def test_a_paused_target_is_refused_and_nothing_changes(store: Store) -> None:
    waiting = await _backlog(store, 2)
    await store.set_paused("crm", True, T0 + 1)
    with pytest.raises(Conflict, match=r"target crm is paused: .*relay resume crm"):
        await store.retry_selected(Selection(status=Status.PENDING, sendable=True), T0 + 2)
    for delivery_id in waiting:
        view = await store.get_delivery(delivery_id)
        assert view is not None
        assert view.next_attempt_at == T0 + 3600
    [entry] = await store.list_audit(1)
    assert entry.action == "pause"  # the refusal is no action


async def test_a_down_target_is_probed_now_not_flooded(store: Store) -> None:
    await store.accept_event(event("a"), [NewDelivery("crm")], T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0)
    for claim in await store.claim_due(T0, T0 + 60, {"crm": 2}):
        streak = await record(store, claim, FAILED, RetryAt(T0 + 10), T0, Hold(2, T0 + 3600))
    assert streak.went_down
    done = await store.retry_selected(WAITING, T0 + 20)
    assert (len(done.ids), done.probed) == (2, ["crm"])
    # Its probe is due now; the claim rule gives a down target one at a time.
    assert await store.down_targets() == {"crm": DownState(T0, T0 + 20, 0, claim.id, probed_at=T0)}


async def test_a_receivers_hold_is_said_and_kept(store: Store) -> None:
    # A 429 holds the whole target (relay.delivery.step, rule 4): what is made
    # due now still waits for the hold to end, and the answer says until when.
    for key in ("a", "b"):
        await store.accept_event(event(key), [NewDelivery("crm")], T0)
    [first] = await store.claim_due(T0, T0 + 30, {"crm": 1})
    too_many = Outcome.retry("HTTP 429", 429, throttle=True)
    limited = AttemptRecord(1, T0, 0.01, "retry", 429, "HTTP 429")
    rules = Rules(RetryPolicy(jitter=0))
    decide = functools.partial(step, rules, Attempted(first, too_many, T0, started=T0))
    await store.record_attempt(first, limited, decide, T0)
    done = await store.retry_selected(WAITING, T0 + 1)
    assert (len(done.ids), done.held) == (2, {"crm": T0 + 2})
