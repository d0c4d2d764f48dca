"""Store contract, the Queue role (the scheduler's verbs): claim_due, next_due,
record_attempt, release, recover_orphans, flag_unconfigured, paused_targets,
down_targets. Runs over every backend (tests/store_backends.py)."""

from __future__ import annotations

import asyncio
import functools

from relay.config import RetryPolicy
from relay.core.outcome import Outcome
from relay.delivery.step import Attempted, Rules, step
from relay.store import (
    INTERRUPTED_LIMIT,
    AttemptRecord,
    Dead,
    Delivered,
    EventQuery,
    FailureStreak,
    History,
    NewDelivery,
    RetryAt,
    Status,
    Step,
    Store,
    TargetHealth,
    Waits,
)

from helpers import record
from samples import T0, TWO, event
from store_backends import Harness

FAILED = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
OK = AttemptRecord(1, T0, 0.01, "success", 200)
SUCCESS = Outcome.success(200)


async def test_a_claim_carries_the_event_as_stored(store: Store) -> None:
    accepted = await store.accept_event(event("k", body=b"\x00\xffbytes"), [NewDelivery("crm")], T0)
    [claimed] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    assert (claimed.event_id, claimed.route, claimed.target) == (accepted.event_id, "orders", "crm")
    assert (claimed.idempotency_key, claimed.received_at) == ("k", T0)
    assert (claimed.payload.method, claimed.payload.path, claimed.payload.query) == (
        "POST",
        "/hooks/orders",
        "x=1",
    )
    assert list(claimed.payload.headers) == [
        ("Content-Type", "application/json"),
        ("X-Dup", "1"),
        ("X-Dup", "2"),
    ]
    assert (claimed.payload.content_type, claimed.payload.body) == (
        "application/json",
        b"\x00\xffbytes",
    )
    assert (claimed.attempts, claimed.attempts_in_cycle) == (0, 0)
    assert (claimed.manual, claimed.resume_status, claimed.resume_at) == (False, None, None)
    view = await store.get_delivery(claimed.id)
    assert view is not None
    assert view.status is Status.IN_FLIGHT


async def test_a_delivery_keeps_one_random_message_tag(store: Store) -> None:
    # What makes its identity (relay.core.identity) unique across databases that
    # number their deliveries alike, and the same on every attempt.
    await store.accept_event(event("a"), [NewDelivery("crm"), NewDelivery("audit")], T0)
    claims = await store.claim_due(T0, T0 + 30, {"crm": 1, "audit": 1})
    tags = {claim.id: claim.message_tag for claim in claims}
    assert len(set(tags.values())) == 2
    assert all(len(tag or "") >= 16 for tag in tags.values())
    assert not any(claim.event_keyed for claim in claims)  # their own identity, not the event's
    for claim in claims:
        await record(store, claim, FAILED, RetryAt(T0 + 10), T0 + 1)
    again = await store.claim_due(T0 + 10, T0 + 70, {"crm": 1, "audit": 1})
    assert {claim.id: claim.message_tag for claim in again} == tags


async def test_claims_go_oldest_due_first_and_skip_what_is_not_pending(store: Store) -> None:
    late = await store.accept_event(event("late"), [NewDelivery("crm")], T0 + 5)
    early = await store.accept_event(event("early"), [NewDelivery("crm")], T0)
    await store.accept_event(
        event("skipped"), [NewDelivery("crm", Status.SKIPPED, "when: false")], T0
    )
    await store.accept_event(event("dead"), [NewDelivery("crm", Status.DEAD, "bad template")], T0)
    # Under a limit, the one due longest goes first (by due time, not by id).
    [first] = await store.claim_due(T0 + 10, T0 + 70, {"crm": 1})
    assert first.event_id == early.event_id
    rest = await store.claim_due(T0 + 10, T0 + 70, {"crm": 10})
    assert [c.event_id for c in rest] == [late.event_id]


async def test_a_zero_limit_or_an_unknown_target_claims_nothing(store: Store) -> None:
    await store.accept_event(event(), TWO, T0)
    assert await store.claim_due(T0, T0 + 60, {"crm": 0}) == []
    assert await store.claim_due(T0, T0 + 60, {}) == []
    assert await store.claim_due(T0, T0 + 60, {"elsewhere": 5}) == []
    [audit] = await store.claim_due(T0, T0 + 60, {"crm": 0, "audit": 5})
    assert audit.target == "audit"


async def test_an_expired_lease_held_by_this_process_is_not_claimed_again(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    [first] = await store.claim_due(T0, T0 + 30, {"crm": 1})
    # The clock jumped past the lease while the attempt is still under way here.
    assert await store.claim_due(T0 + 100, T0 + 160, {"crm": 1}, exclude=[first.id]) == []
    [again] = await store.claim_due(T0 + 100, T0 + 160, {"crm": 1})
    assert again.id == first.id


async def test_next_due_is_the_earliest_of_waits_and_leases(store: Store) -> None:
    assert await store.next_due([]) == {}
    await store.accept_event(event("a"), TWO, T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0 + 50)
    [crm] = await store.claim_due(T0, T0 + 30, {"crm": 1})
    assert await store.next_due(["crm", "audit", "mail"]) == {"crm": T0 + 30, "audit": T0}
    await record(store, crm, FAILED, RetryAt(T0 + 500), T0)
    assert await store.next_due(["crm"]) == {"crm": T0 + 50}


async def test_record_attempt_asks_the_step_with_what_it_holds_and_writes_it(
    store: Store,
) -> None:
    # The step that follows an attempt (relay.delivery.step) is asked by the
    # store, in the transaction that records it, with the target's row and
    # the delivery's memory of failing as stored; what it returns is written.
    await store.accept_event(event("a"), [NewDelivery("crm")], T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0)
    first, second = await store.claim_due(T0, T0 + 60, {"crm": 2})
    await record(store, first, FAILED, RetryAt(T0 + 10), T0)
    asked: list[tuple[TargetHealth, History]] = []

    def decide(health: TargetHealth, history: History) -> Step:
        asked.append((health, history))
        streak = FailureStreak(health.consecutive_failures, health.consecutive_failures + 1)
        return Step(
            RetryAt(T0 + 99),
            in_cycle=True,
            streak=streak,
            target={"consecutive_failures": streak.after, "last_error": "told"},
            remember=History(seen_successes=7, fails_alone=True),
        )

    step = await store.record_attempt(second, FAILED, decide, T0 + 1)
    [(health, history)] = asked
    assert (health.consecutive_failures, history) == (1, History())
    assert step.streak == FailureStreak(1, 2)
    view = await store.get_delivery(second.id)
    assert view is not None
    assert (view.status, view.next_attempt_at, view.attempts_in_cycle) == (
        Status.PENDING,
        T0 + 99,
        1,
    )
    states = await store.target_states()
    assert (states["crm"].consecutive_failures, states["crm"].last_error) == (2, "told")
    # The memory written is what the next failure of that delivery is asked with.
    [again] = [c for c in await store.claim_due(T0 + 99, T0 + 160, {"crm": 2}) if c.id == second.id]
    asked.clear()
    await store.record_attempt(again, FAILED, decide, T0 + 100)
    assert asked[0][1] == History(seen_successes=7, fails_alone=True)


async def test_record_attempt_counts_and_keeps_every_attempt(store: Store) -> None:
    accepted = await store.accept_event(event(), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, FAILED, RetryAt(T0 + 10), T0)
    [claim] = await store.claim_due(T0 + 10, T0 + 70, {"crm": 1})
    assert (claim.attempts, claim.attempts_in_cycle) == (1, 1)
    second = AttemptRecord(2, T0 + 10, 0.5, "retry", None, "connection refused", b"")
    await record(store, claim, second, RetryAt(T0 + 30), T0 + 10)
    [claim] = await store.claim_due(T0 + 30, T0 + 90, {"crm": 1})
    assert (claim.attempts, claim.attempts_in_cycle) == (2, 2)
    third = AttemptRecord(3, T0 + 30, 0.2, "success", 200, None, b"ok")
    await record(store, claim, third, Delivered(), T0 + 30)
    detail = await store.get_event(accepted.event_id)
    assert detail is not None
    [delivery] = detail.event.deliveries
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at, delivery.last_error) == (
        Status.DELIVERED,
        3,
        None,
        None,
    )
    assert delivery.updated_at == T0 + 30
    log = detail.attempts[delivery.id]
    assert [
        (a.number, a.started_at, a.duration, a.outcome, a.error, a.next_attempt_at) for a in log
    ] == [
        (1, T0, 0.01, "retry", "HTTP 503", T0 + 10),
        (2, T0 + 10, 0.5, "retry", "connection refused", T0 + 30),
        (3, T0 + 30, 0.2, "success", None, None),
    ]
    assert log[2].response == b"ok"
    assert await store.claim_due(T0 + 1000, T0 + 1060, {"crm": 1}) == []


async def test_a_dead_delivery_says_why_and_is_never_claimed(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    attempt = AttemptRecord(1, T0, 0.01, "fail", 400, "HTTP 400")
    await record(store, claim, attempt, Dead("HTTP 400: bad field"), T0)
    view = await store.get_delivery(claim.id)
    assert view is not None
    assert (view.status, view.last_error, view.next_attempt_at) == (
        Status.DEAD,
        "HTTP 400: bad field",
        None,
    )
    assert await store.claim_due(T0 + 10**6, T0 + 10**6 + 60, {"crm": 1}) == []
    assert await store.next_due(["crm"]) == {}


async def test_the_failure_streak_counts_failures_in_a_row_per_target(store: Store) -> None:
    for i in range(3):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    claims = await store.claim_due(T0, T0 + 60, {"crm": 3})
    first = await record(store, claims[0], FAILED, RetryAt(T0 + 9), T0)
    second = await record(store, claims[1], FAILED, RetryAt(T0 + 9), T0 + 1)
    assert (first.before, first.after, second.before, second.after) == (0, 1, 1, 2)
    state = (await store.target_states())["crm"]
    assert (state.consecutive_failures, state.last_error, state.last_error_at) == (
        2,
        "HTTP 503",
        T0 + 1,
    )
    # A failure the event caused (a template) says nothing about the target.
    blameless = AttemptRecord(1, T0, 0.0, "fail", None, "template error", target_at_fault=False)
    third = await record(store, claims[2], blameless, Dead("template error"), T0 + 2)
    assert (third.before, third.after) == (2, 2)
    [again] = await store.claim_due(T0 + 9, T0 + 69, {"crm": 1})
    fourth = await record(store, again, OK, Delivered(), T0 + 9)
    assert (fourth.before, fourth.after) == (2, 0)
    state = (await store.target_states())["crm"]
    assert (state.consecutive_failures, state.last_success_at) == (0, T0 + 9)


async def test_the_last_success_shown_lags_by_at_most_a_second(store: Store) -> None:
    # A success after a success writes nothing of its target's row
    # (relay.store.health): the time shown is at most SUCCESS_SHOWN_WITHIN old.
    for i in range(4):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    claims = await store.claim_due(T0, T0 + 60, {"crm": 4})
    shown = []
    for claim, at in zip(claims, (T0 + 1, T0 + 1.5, T0 + 2.2, T0 + 2.3), strict=True):
        streak = await record(store, claim, OK, Delivered(), at)
        assert (streak.before, streak.after) == (0, 0)
        shown.append((await store.target_states())["crm"].last_success_at)
    assert shown == [T0 + 1, T0 + 1, T0 + 2.2, T0 + 2.2]


async def test_attempts_recorded_in_one_group_commit_keep_every_row_and_the_streaks(
    store: Store,
) -> None:
    # Attempts that finish together are recorded together (SQLite writes a
    # run of successes in bulk; PostgreSQL on several connections): each
    # keeps its row and its delivery's fate, and the streaks read as if they
    # were recorded one after another, in some order.
    for i in range(12):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    claims = await store.claim_due(T0, T0 + 60, {"crm": 12})
    await asyncio.gather(
        *(record(store, claim, FAILED, RetryAt(T0 + 9), T0) for claim in claims[:2])
    )
    oks = [
        AttemptRecord(1, T0 + 1, 0.02, "success", 200, None, b"ok %d" % claim.id)
        for claim in claims[2:]
    ]
    streaks = await asyncio.gather(
        *(
            record(store, claim, ok, Delivered(), T0 + 1 + n / 100)
            for n, (claim, ok) in enumerate(zip(claims[2:], oks, strict=True))
        )
    )
    assert sorted((s.before, s.after) for s in streaks) == [(0, 0)] * 9 + [(2, 0)]
    state = (await store.target_states())["crm"]
    assert state.consecutive_failures == 0
    assert state.last_success_at is not None
    assert T0 + 1 <= state.last_success_at <= T0 + 1.09
    for claim in claims[2:]:
        view = await store.get_event(claim.event_id)
        assert view is not None
        [delivery] = view.event.deliveries
        assert (delivery.status, delivery.attempts, delivery.updated_at) == (
            Status.DELIVERED,
            1,
            T0 + 1 + (claims.index(claim) - 2) / 100,
        )
        [row] = view.attempts[delivery.id]
        assert (row.outcome, row.http_status, row.response) == ("success", 200, b"ok %d" % claim.id)
    # A failure among successes: the streaks of one order or another.
    for i in range(3):
        await store.accept_event(event(f"m{i}"), [NewDelivery("crm")], T0 + 2)
    more = await store.claim_due(T0 + 2, T0 + 60, {"crm": 3})
    mixed = await asyncio.gather(
        record(store, more[0], OK, Delivered(), T0 + 3),
        record(store, more[1], FAILED, RetryAt(T0 + 20), T0 + 3),
        record(store, more[2], OK, Delivered(), T0 + 3),
    )
    failures = (await store.target_states())["crm"].consecutive_failures
    # Failed last: [(0, 0), (0, 0), (0, 1)]; else the success after it resets it.
    expected = [(0, 0), (0, 0), (0, 1)] if failures == 1 else [(0, 0), (0, 1), (1, 0)]
    assert sorted((s.before, s.after) for s in mixed) == expected


async def test_heads_of_several_lines_delivered_together_each_let_their_next_go(
    store: Store,
) -> None:
    # Recorded in one group commit (PostgreSQL writes such a run in one
    # statement): each line's next is due, and only it; a delivery of no line
    # lets nothing go.
    for key in ("A", "B", "C"):
        for n in range(2):
            await store.accept_event(
                event(f"{key}{n}"), [NewDelivery("crm", order_key=key)], T0 + n
            )
    await store.accept_event(event("free"), [NewDelivery("crm")], T0)
    heads = await store.claim_due(T0 + 5, T0 + 65, {"crm": 10})
    assert len(heads) == 4  # A0, B0, C0 and the free one
    await asyncio.gather(
        *(
            record(store, head, AttemptRecord(1, T0 + 5, 0.01, "success", 200), Delivered(), T0 + 6)
            for head in heads
        )
    )
    nexts = await store.claim_due(T0 + 6, T0 + 66, {"crm": 10})
    keys = {n.event_id for n in nexts}
    seconds = set()
    for key in ("A", "B", "C"):
        found = await store.list_events(EventQuery(key=f"{key}1"))
        seconds |= {view.id for view in found}
    assert keys == seconds
    for head in heads:
        view = await store.get_delivery(head.id)
        assert view is not None
        assert (view.status, view.attempts) == (Status.DELIVERED, 1)


async def test_a_waits_transition_spends_no_retry_and_goes_to_the_back(store: Store) -> None:
    await store.accept_event(event("a"), [NewDelivery("crm")], T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    probe = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
    await record(store, claim, probe, Waits(T0 + 1), T0 + 1)
    view = await store.get_delivery(claim.id)
    assert view is not None
    # Pending, no step of the cycle spent, behind what was waiting already.
    assert (view.status, view.next_attempt_at, view.attempts, view.attempts_in_cycle) == (
        Status.PENDING,
        T0 + 1,
        1,
        0,
    )
    [other] = await store.claim_due(T0 + 1, T0 + 61, {"crm": 1})
    assert other.id != claim.id


async def test_release_gives_leases_back_and_leaves_finished_ones_alone(store: Store) -> None:
    await store.accept_event(event(), TWO, T0)
    crm, audit = sorted(await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1}), key=str)
    await record(store, audit, OK, Delivered(), T0)
    await store.release([], T0)
    await store.release([crm.id, audit.id], T0 + 1)
    views = {
        v.target: v
        for v in [await store.get_delivery(crm.id), await store.get_delivery(audit.id)]
        if v
    }
    assert (views["crm"].status, views["crm"].attempts) == (Status.PENDING, 0)
    assert views["audit"].status is Status.DELIVERED
    [again] = await store.claim_due(T0 + 1, T0 + 61, {"crm": 1, "audit": 1})
    assert again.id == crm.id


async def test_after_a_crash_the_next_process_takes_orphaned_leases_back_at_once(
    backend: Harness,
) -> None:
    store = await backend.open()
    await store.accept_event(event("a"), TWO, T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0)
    claimed = await store.claim_due(T0, T0 + 3600, {"crm": 5, "audit": 5})
    assert len(claimed) == 3
    await record(store, claimed[0], FAILED, RetryAt(T0 + 10**6), T0)
    # The process dies with two attempts under way; their leases run an hour.
    # (SQLite takes them back at once: see test_sqlite.py; a shared store
    # when they expire, as another instance may still be at work.)
    store = await backend.restart(store)
    later = T0 + 3600
    assert (await store.recover_orphans(later)).taken_back == 2
    again = await store.claim_due(later, later + 60, {"crm": 5, "audit": 5})
    assert sorted(c.id for c in again) == sorted(c.id for c in claimed[1:])
    # An interrupted attempt is counted (the next says X-Relay-Attempt: 2),
    # not spent: the cycle's count, the retry budget, is as it was.
    assert [(c.attempts, c.attempts_in_cycle) for c in again] == [(1, 0), (1, 0)]
    view = await store.get_delivery(claimed[0].id)
    assert view is not None
    assert (view.status, view.attempts) == (Status.PENDING, 1)  # recorded: not an orphan
    assert (
        await store.recover_orphans(later + 1)
    ).taken_back == 2  # its own leases, from this start
    assert (await store.recover_orphans(later + 1)).taken_back == 0


async def test_a_delivery_relay_keeps_stopping_on_is_parked_dead(backend: Harness) -> None:
    # A stored event cannot keep stopping relay: an attempt cut short by a
    # stop spends no retry, but after INTERRUPTED_LIMIT in a row the delivery
    # is parked dead, saying why, and the others are taken back as usual.
    store = await backend.open()
    await store.accept_event(event("poison"), [NewDelivery("crm")], T0)
    [poison] = await store.claim_due(T0, T0 + 1, {"crm": 1})
    await record(store, poison, FAILED, RetryAt(T0), T0)  # one attempt recorded
    now = T0 + 10
    for stop in range(1, INTERRUPTED_LIMIT + 1):
        if stop == INTERRUPTED_LIMIT:
            await store.accept_event(event("other"), [NewDelivery("crm")], now)
        claimed = await store.claim_due(now, now + 1, {"crm": 5})
        assert poison.id in [c.id for c in claimed]
        store = await backend.restart(store)  # relay stops while sending it
        now += 10
        recovered = await store.recover_orphans(now)
        parked = stop == INTERRUPTED_LIMIT
        assert recovered.parked == ((poison.id,) if parked else ())
        assert recovered.taken_back == (2 if parked else 1)
    view = await store.get_delivery(poison.id)
    assert view is not None
    assert view.status is Status.DEAD
    assert view.attempts == 1 + INTERRUPTED_LIMIT
    assert "stopped 5 times in a row while sending it" in (view.last_error or "")
    assert [c.id for c in await store.claim_due(now, now + 1, {"crm": 5})] == [poison.id + 1]


async def test_deliveries_for_a_target_gone_from_the_config_wait_with_a_note(store: Store) -> None:
    await store.accept_event(event("a"), TWO, T0)
    await store.accept_event(event("b"), [NewDelivery("old")], T0)
    await store.accept_event(event("c"), [NewDelivery("old")], T0)
    [old_claim] = await store.claim_due(T0, T0 + 60, {"old": 1})
    assert await store.flag_unconfigured(["crm", "audit"], T0 + 1) == {"old": 2}
    pending = await store.get_delivery(old_claim.id + 1)
    assert pending is not None
    assert pending.status is Status.PENDING  # kept, never dropped
    assert pending.last_error is not None
    assert "old" in pending.last_error
    [first] = await store.list_events(EventQuery(key="a"))
    assert all(d.last_error is None for d in first.deliveries)  # configured: no note
    assert await store.flag_unconfigured(["crm", "audit", "old"], T0 + 2) == {}


async def test_pause_is_kept_in_the_store(backend: Harness) -> None:
    store = await backend.open()
    assert await store.paused_targets() == frozenset()
    await store.set_paused("crm", True, T0)
    await store.set_paused("mail", True, T0)
    await store.set_paused("mail", False, T0 + 1)
    assert await store.paused_targets() == {"crm"}
    # A restart keeps it.
    store = await backend.restart(store)
    assert await store.paused_targets() == {"crm"}
    assert (await store.target_states())["crm"].paused


async def test_a_throttles_episode_is_kept_and_a_success_ends_it(store: Store) -> None:
    # relay.delivery.step, rule 4: the store keeps the hold and the episode's
    # count (the scheduler's poll reads them: a restart, another instance),
    # and a success, recorded alone or with others, ends it.
    for key in ("a", "b", "c"):
        await store.accept_event(event(key), [NewDelivery("crm")], T0)
    [first] = await store.claim_due(T0, T0 + 30, {"crm": 1})
    rules = Rules(RetryPolicy(jitter=0))
    too_many = Outcome.retry("HTTP 429", 429, throttle=True)
    limited = AttemptRecord(1, T0, 0.01, "retry", 429, "HTTP 429")
    decide = functools.partial(step, rules, Attempted(first, too_many, T0, started=T0))
    done = await store.record_attempt(first, limited, decide, T0)
    assert (done.then, done.in_cycle) == (RetryAt(first.received_at, hold_until=T0 + 2), False)
    assert (await store.held_targets()).throttled == {"crm": T0 + 2}
    claims = await store.claim_due(T0 + 3, T0 + 60, {"crm": 3})
    assert claims[0].id == first.id  # first in line, by arrival
    await asyncio.gather(
        *(
            store.record_attempt(
                claim, OK, functools.partial(step, rules, Attempted(claim, SUCCESS, T0 + 3)), T0 + 3
            )
            for claim in claims
        )
    )
    assert (await store.held_targets()).throttled == {}
    [state] = (await store.target_states()).values()
    assert (state.throttled_until, state.throttles) == (T0 + 2, 0)
