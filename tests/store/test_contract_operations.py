"""Store contract, the Operations role (what a person does): retry_now (and the
manual-retry rule across a stop, a crash and a success), skip, requeue, count,
resend, set_paused (resuming a down target probes it). Runs over every
backend (tests/store_backends.py)."""

from __future__ import annotations

import dataclasses

import pytest

from relay.core.secrets import Masker
from relay.ops.search import documents, parse_search
from relay.store import (
    AttemptRecord,
    ClaimedDelivery,
    Conflict,
    Dead,
    Delivered,
    DownState,
    HeldKey,
    HeldTargets,
    NewDelivery,
    NotFound,
    Resend,
    RetryAt,
    Selection,
    Status,
    Store,
)

from helpers import Hold, record
from samples import T0, TWO, event
from store_backends import Harness

FAILED = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")


async def _dead(
    store: Store, key: str = "k", at: float = T0, body: bytes = b'{"a": 1}'
) -> ClaimedDelivery:
    """A crm delivery that went dead after one attempt."""
    await store.accept_event(event(key, at=at, body=body), [NewDelivery("crm")], at)
    [claim] = await store.claim_due(at, at + 60, {"crm": 1})
    await record(store, claim, FAILED, Dead("HTTP 503 too long"), at)
    return claim


async def test_retry_now_makes_a_dead_delivery_due_keeping_its_count(store: Store) -> None:
    dead = await _dead(store)
    view = await store.retry_now(dead.id, T0 + 100)
    assert (view.status, view.next_attempt_at, view.attempts) == (Status.PENDING, T0 + 100, 1)
    [claim] = await store.claim_due(T0 + 100, T0 + 160, {"crm": 1})
    # The scheduler learns it is a manual attempt, and where a failure returns it.
    assert (claim.manual, claim.resume_status, claim.resume_at) == (True, Status.DEAD, None)
    assert claim.attempts == 1
    # It fails: retry.decide says back to dead, and no step of the cycle (the
    # rule is in relay.delivery.retry); the store records the attempt as told.
    failed = AttemptRecord(2, T0 + 100, 0.01, "retry", 503, "HTTP 503")
    await record(store, claim, failed, Dead("still"), T0 + 100)
    after = await store.get_delivery(dead.id)
    assert after is not None
    assert (after.status, after.attempts, after.attempts_in_cycle) == (Status.DEAD, 2, 1)
    detail = await store.get_event(dead.event_id)
    assert detail is not None
    assert [(e.kind, e.at) for e in detail.log[dead.id]] == [("retry", T0 + 100)]


async def test_retry_now_on_a_waiting_delivery_keeps_its_schedule(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, FAILED, RetryAt(T0 + 3600), T0)
    view = await store.retry_now(claim.id, T0 + 10)
    assert (view.status, view.next_attempt_at) == (Status.PENDING, T0 + 10)
    # Asking twice is asking once: one log entry, the first schedule kept.
    await store.retry_now(claim.id, T0 + 20)
    [manual] = await store.claim_due(T0 + 20, T0 + 80, {"crm": 1})
    assert (manual.manual, manual.resume_status, manual.resume_at) == (
        True,
        Status.PENDING,
        T0 + 3600,
    )
    assert manual.attempts_in_cycle == 1
    # It fails: retry.decide returns it to its place, no step of the cycle.
    failed = AttemptRecord(2, T0 + 20, 0.01, "retry", 503, "HTTP 503")
    await record(store, manual, failed, RetryAt(T0 + 3600), T0 + 20)
    after = await store.get_delivery(claim.id)
    assert after is not None
    assert (after.status, after.next_attempt_at, after.attempts, after.attempts_in_cycle) == (
        Status.PENDING,
        T0 + 3600,
        2,
        1,
    )
    detail = await store.get_event(claim.event_id)
    assert detail is not None
    assert [e.kind for e in detail.log[claim.id]] == ["retry"]
    # The next claim of it is an ordinary step of the schedule again.
    [scheduled] = await store.claim_due(T0 + 3600, T0 + 3660, {"crm": 1})
    assert (scheduled.manual, scheduled.resume_status) == (False, None)


async def test_retry_now_refuses_what_it_cannot_retry(store: Store) -> None:
    accepted = await store.accept_event(
        event(), [NewDelivery("crm"), NewDelivery("audit"), NewDelivery("skip", Status.SKIPPED)], T0
    )
    claims = {c.target: c for c in await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1})}
    await record(
        store, claims["audit"], AttemptRecord(1, T0, 0.01, "success", 200), Delivered(), T0
    )
    detail = await store.get_event(accepted.event_id)
    assert detail is not None
    skipped = next(d for d in detail.event.deliveries if d.target == "skip")
    with pytest.raises(Conflict, match="in_flight"):
        await store.retry_now(claims["crm"].id, T0)
    with pytest.raises(Conflict, match="delivered"):
        await store.retry_now(claims["audit"].id, T0)
    with pytest.raises(Conflict, match="skipped"):
        await store.retry_now(skipped.id, T0)
    with pytest.raises(NotFound):
        await store.retry_now(10_000, T0)


async def test_skip_sets_a_delivery_aside_for_good(store: Store) -> None:
    dead = await _dead(store)
    view = await store.skip(dead.id, T0 + 5)
    assert (view.status, view.next_attempt_at) == (Status.SKIPPED, None)
    assert view.last_error is not None
    assert "skipped" in view.last_error
    detail = await store.get_event(dead.event_id)
    assert detail is not None
    assert [e.kind for e in detail.log[dead.id]] == ["skip"]
    with pytest.raises(Conflict):
        await store.skip(dead.id, T0 + 6)
    waiting = await store.accept_event(event("p"), [NewDelivery("crm")], T0)
    [pending] = (await store.get_event(waiting.event_id)).event.deliveries  # type: ignore[union-attr]
    assert (await store.skip(pending.id, T0 + 7)).status is Status.SKIPPED
    assert await store.claim_due(T0 + 10, T0 + 70, {"crm": 5}) == []


async def test_requeue_starts_a_fresh_cycle_keeping_the_history(store: Store) -> None:
    dead = await _dead(store)
    assert await store.count(Selection()) == 1
    assert await store.requeue(Selection(), T0 + 100) == [dead.id]
    view = await store.get_delivery(dead.id)
    assert view is not None
    assert (view.status, view.next_attempt_at, view.attempts, view.attempts_in_cycle) == (
        Status.PENDING,
        T0 + 100,
        1,
        0,
    )
    [claim] = await store.claim_due(T0 + 100, T0 + 160, {"crm": 1})
    # A fresh cycle, not a manual attempt: a failure follows the schedule again.
    assert (claim.manual, claim.resume_status, claim.attempts, claim.attempts_in_cycle) == (
        False,
        None,
        1,
        0,
    )
    await record(
        store,
        claim,
        AttemptRecord(2, T0 + 100, 0.01, "retry", 503, "HTTP 503"),
        RetryAt(T0 + 110),
        T0 + 100,
    )
    after = await store.get_delivery(dead.id)
    assert after is not None
    assert (after.attempts, after.attempts_in_cycle) == (2, 1)
    detail = await store.get_event(dead.event_id)
    assert detail is not None
    assert [a.number for a in detail.attempts[dead.id]] == [1, 2]  # history kept
    assert [e.kind for e in detail.log[dead.id]] == ["requeue"]


async def test_requeue_and_count_take_what_the_selection_names(store: Store) -> None:
    a = await _dead(store, "a", T0)
    await store.accept_event(event("b", route="leads", at=T0 + 10), [NewDelivery("crm")], T0 + 10)
    [b] = await store.claim_due(T0 + 10, T0 + 70, {"crm": 1})
    await record(store, b, FAILED, Dead("no"), T0 + 10)
    c = await _dead(store, "c", T0 + 20)
    pending = await store.accept_event(event("p"), [NewDelivery("crm")], T0 + 30)

    assert await store.count(Selection(route="leads")) == 1
    assert await store.count(Selection(since=T0 + 5, until=T0 + 20)) == 1
    assert await store.count(Selection(ids=(a.id, c.id))) == 2
    assert await store.count(Selection(target="audit")) == 0
    assert await store.count(Selection(status=Status.PENDING)) == 1
    # Pending ones are never requeued: they already wait for their next attempt.
    assert await store.requeue(Selection(status=Status.PENDING), T0 + 40) == []
    assert await store.requeue(Selection(since=T0 + 5, until=T0 + 20), T0 + 40) == [b.id]
    assert await store.requeue(Selection(ids=(a.id, c.id)), T0 + 40) == sorted([a.id, c.id])
    assert await store.count(Selection()) == 0
    assert await store.requeue(Selection(), T0 + 41) == []
    detail = await store.get_event(pending.event_id)
    assert detail is not None
    assert detail.log[detail.event.deliveries[0].id] == ()


async def test_requeue_sends_a_delivered_one_again(store: Store) -> None:
    await store.accept_event(event(), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, AttemptRecord(1, T0, 0.01, "success", 200), Delivered(), T0)
    assert await store.requeue(Selection(status=Status.DELIVERED), T0 + 5) == [claim.id]
    [again] = await store.claim_due(T0 + 5, T0 + 65, {"crm": 1})
    assert (again.id, again.attempts, again.attempts_in_cycle) == (claim.id, 1, 0)


async def test_resend_stores_an_edited_copy_linked_to_the_original(store: Store) -> None:
    original = await store.accept_event(event("k", body=b'{"phone": "bad"}'), TWO, T0)
    copy_id = await store.resend(
        Resend(
            original_id=original.event_id,
            headers=(("Content-Type", "application/json"),),
            body=b'{"phone": "+7 900"}',
            content_type="application/json",
            targets=("crm",),
            by="cli user anna",
        ),
        T0 + 50,
    )
    assert copy_id != original.event_id
    copy = await store.get_event(copy_id)
    assert copy is not None
    assert (copy.payload.body, copy.event.route, copy.event.idempotency_key) == (
        b'{"phone": "+7 900"}',
        "orders",
        None,  # goes out with its own id as the key
    )
    assert copy.event.received_at == T0 + 50
    assert [(d.target, d.status, d.next_attempt_at) for d in copy.event.deliveries] == [
        ("crm", Status.PENDING, T0 + 50)
    ]
    assert copy.resent_from is not None
    assert (copy.resent_from.original_id, copy.resent_from.by, copy.resent_from.at) == (
        original.event_id,
        "cli user anna",
        T0 + 50,
    )
    first = await store.get_event(original.event_id)
    assert first is not None
    assert first.payload.body == b'{"phone": "bad"}'  # the original never changes
    assert [link.copy_id for link in first.resent_as] == [copy_id]
    # The original's key is still its own: a re-send of it is a duplicate of it.
    again = await store.accept_event(event("k", body=b'{"phone": "bad"}'), TWO, T0 + 60)
    assert (again.duplicate, again.event_id) == (True, original.event_id)
    with pytest.raises(NotFound):
        await store.resend(Resend(10_000, (), b"{}", "application/json", ("crm",), "x"), T0 + 70)


def _copy_of(event_id: int, targets: tuple[str, ...] = ("crm",)) -> Resend:
    return Resend(
        event_id, (), b'{"phone": "+7 900"}', "application/json", targets, "cli user anna"
    )


async def test_a_delivered_copy_resolves_the_originals_dead_delivery_to_its_target(
    store: Store,
) -> None:
    # The original: dead to crm, delivered to audit. A copy to crm supersedes
    # it (the dead count is the copy's to carry), and fails; a copy of the
    # copy supersedes that one and is delivered: both are resolved, linked
    # both ways, and the dead count is back to 0.
    original = await store.accept_event(event("k", body=b'{"phone": "bad"}'), TWO, T0)
    crm, audit = sorted(await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1}), key=str)
    await record(store, crm, FAILED, Dead("HTTP 422"), T0)
    await record(store, audit, AttemptRecord(1, T0, 0.01, "success", 200), Delivered(), T0)
    assert (await store.stats()).dead == 1

    first_copy = await store.resend(_copy_of(original.event_id), T0 + 10)
    assert (await store.stats()).dead == 0
    [claim] = await store.claim_due(T0 + 10, T0 + 70, {"crm": 1})
    assert claim.resolves == crm.id
    await record(store, claim, FAILED, Dead("HTTP 422 again"), T0 + 10)
    assert (await store.stats()).dead == 1  # the copy's; the original stays stopped
    stopped = await store.get_delivery(crm.id)
    assert stopped is not None
    assert (stopped.status, stopped.resolved_by) == (Status.SUPERSEDED, claim.id)

    second_copy = await store.resend(_copy_of(first_copy), T0 + 20)
    [fixed] = await store.claim_due(T0 + 20, T0 + 80, {"crm": 1})
    assert fixed.resolves == claim.id
    ok = AttemptRecord(1, T0 + 20, 0.01, "success", 200)
    await record(store, fixed, ok, Delivered(), T0 + 20)

    stats = await store.stats()
    assert stats.dead == 0
    assert stats.counts_by_target["crm"] == {Status.RESOLVED: 2, Status.DELIVERED: 1}
    assert (await store.gauges()).counts.get(("crm", Status.DEAD), 0) == 0
    for event_id, delivery_id in ((original.event_id, crm.id), (first_copy, claim.id)):
        detail = await store.get_event(event_id)
        assert detail is not None
        view = next(d for d in detail.event.deliveries if d.id == delivery_id)
        assert (view.status, view.resolved_by) == (Status.RESOLVED, fixed.id)
        assert [e.kind for e in detail.log[delivery_id]] == ["superseded", "resolved"]
        assert f"delivery {fixed.id} of event {second_copy}" in (
            detail.log[delivery_id][-1].detail or ""
        )
    top = await store.get_event(original.event_id)
    assert top is not None
    assert top.event.status is Status.RESOLVED
    shown = await store.get_delivery(fixed.id)
    assert shown is not None
    assert shown.resolves == claim.id
    # Resolved is finished: never retried, skipped or claimed; purged like delivered.
    with pytest.raises(Conflict):
        await store.retry_now(crm.id, T0 + 30)
    with pytest.raises(Conflict):
        await store.skip(crm.id, T0 + 30)
    assert await store.purge({}, T0 + 10**6, limit=10, dry_run=True) == 3


async def test_a_superseded_delivery_is_never_sent_again_and_says_which_copy_goes(
    store: Store,
) -> None:
    dead = await _dead(store)
    copy_id = await store.resend(_copy_of(dead.event_id), T0 + 10)
    copy = await store.get_event(copy_id)
    assert copy is not None
    [instead] = copy.event.deliveries
    # A requeue (by id, by filter, of any state it takes) leaves it: the copy is
    # the one to requeue. Retry and skip say which copy goes instead.
    for status in (Status.DEAD, Status.DELIVERED, Status.SKIPPED, Status.SUPERSEDED):
        assert await store.requeue(Selection(status=status, ids=(dead.id,)), T0 + 11) == []
    with pytest.raises(Conflict, match=f"superseded by delivery {instead.id}"):
        await store.retry_now(dead.id, T0 + 12)
    with pytest.raises(Conflict, match="superseded"):
        await store.skip(dead.id, T0 + 12)
    claims = await store.claim_due(T0 + 20, T0 + 80, {"crm": 5})
    assert [c.id for c in claims] == [instead.id]
    ok = AttemptRecord(1, T0 + 20, 0.01, "success", 200)
    await record(store, claims[0], ok, Delivered(), T0 + 20)
    view = await store.get_delivery(dead.id)
    assert view is not None
    assert (view.status, view.resolved_by) == (Status.RESOLVED, instead.id)


async def test_a_manual_attempt_lost_mid_way_is_still_manual_when_claimed_again(
    backend: Harness,
) -> None:
    """A person's retry whose attempt never got recorded (relay stopped with it
    in flight, or died and its lease ran out) keeps the manual rule: the next
    claim is that same extra try, and a failure still returns it to dead."""
    store = await backend.open()
    dead = await _dead(store)
    await store.retry_now(dead.id, T0 + 100)
    [claim] = await store.claim_due(T0 + 100, T0 + 160, {"crm": 1})
    await store.release([claim.id], T0 + 101)  # a stop: the lease given back
    [again] = await store.claim_due(T0 + 102, T0 + 162, {"crm": 1})
    assert (again.id, again.manual, again.resume_status, again.attempts) == (
        dead.id,
        True,
        Status.DEAD,
        1,
    )
    store = await backend.restart(store)  # a crash: the lease runs out
    [after_crash] = await store.claim_due(T0 + 200, T0 + 260, {"crm": 1})
    assert (after_crash.id, after_crash.manual, after_crash.resume_status) == (
        dead.id,
        True,
        Status.DEAD,
    )
    failed = AttemptRecord(2, T0 + 200, 0.01, "retry", 503, "HTTP 503")
    await record(store, after_crash, failed, Dead("still"), T0 + 200)
    view = await store.get_delivery(dead.id)
    assert view is not None
    assert (view.status, view.attempts, view.attempts_in_cycle) == (Status.DEAD, 2, 1)


async def test_a_manual_attempt_that_succeeds_delivers_and_the_rule_ends(store: Store) -> None:
    dead = await _dead(store)
    await store.retry_now(dead.id, T0 + 100)
    [claim] = await store.claim_due(T0 + 100, T0 + 160, {"crm": 1})
    ok = AttemptRecord(2, T0 + 100, 0.01, "success", 200)
    await record(store, claim, ok, Delivered(), T0 + 100)
    view = await store.get_delivery(dead.id)
    assert view is not None
    assert (view.status, view.attempts, view.attempts_in_cycle, view.next_attempt_at) == (
        Status.DELIVERED,
        2,
        1,
        None,
    )
    # Requeued later, it is an ordinary delivery again, not a manual attempt.
    await store.requeue(Selection(status=Status.DELIVERED), T0 + 200)
    [fresh] = await store.claim_due(T0 + 200, T0 + 260, {"crm": 1})
    assert (fresh.manual, fresh.resume_status, fresh.attempts_in_cycle) == (False, None, 0)


async def test_resuming_a_down_target_makes_its_probe_due_now(store: Store) -> None:
    await store.accept_event(event("a"), [NewDelivery("crm")], T0)
    await store.accept_event(event("b"), [NewDelivery("crm")], T0)
    failed = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
    for claim in await store.claim_due(T0, T0 + 60, {"crm": 2}):
        streak = await record(store, claim, failed, RetryAt(T0 + 10), T0, Hold(2, T0 + 3600))
    assert streak.went_down
    await store.set_paused("crm", True, T0 + 5)
    # Pausing: as it was (the failure that made it down named as its last probe).
    down = DownState(T0, T0 + 3600, 0, claim.id, probed_at=T0)
    assert await store.down_targets() == {"crm": down}
    await store.set_paused("crm", False, T0 + 20)
    assert await store.down_targets() == {"crm": dataclasses.replace(down, probe_at=T0 + 20)}
    # Resuming a target that is not down changes nothing of the kind.
    await store.set_paused("mail", True, T0 + 20)
    await store.set_paused("mail", False, T0 + 21)
    assert set(await store.down_targets()) == {"crm"}
    assert await store.paused_targets() == frozenset()


async def test_held_targets_reads_paused_and_down_together(store: Store) -> None:
    assert await store.held_targets() == HeldTargets(frozenset(), {})
    await store.accept_event(event("a"), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, FAILED, RetryAt(T0 + 10), T0, Hold(1, T0 + 3600))
    await store.set_paused("mail", True, T0 + 1)
    await store.set_paused("crm", True, T0 + 2)  # both paused and down
    held = await store.held_targets()
    down = {"crm": DownState(T0, T0 + 3600, 0, claim.id, probed_at=T0)}
    assert held == HeldTargets(frozenset({"mail", "crm"}), down)
    assert (held.paused, held.down) == (
        await store.paused_targets(),
        await store.down_targets(),
    )


async def test_a_bulk_action_takes_exactly_what_a_search_or_key_shows(store: Store) -> None:
    # The Dead letter page with its search box filled: 2 of 4 dead deliveries
    # to crm match; the bulk action must take those 2, not every dead one.
    bodies = [b'{"phone": "+7 999 123-45-67"}', b'{"phone": "111"}', b'{"phone": "89991234567"}']
    claims = [await _dead(store, f"k{n}", T0 + n, body) for n, body in enumerate(bodies)]
    other = await _dead(store, "k3", T0 + 3, b'{"name": "Anna"}')
    sources = await store.events_to_index(10, body_limit=1000)
    await store.index_events(documents(sources, Masker()), sources[-1].event_id)

    phone = Selection(target="crm", search=parse_search("79991234567"))
    assert await store.count(phone) == 2
    assert await store.select(phone, 10) == [claims[0].id, claims[2].id]
    assert await store.select(phone, 1) == [claims[0].id]  # oldest first, bounded
    assert await store.select(Selection(key="k1"), 10) == [claims[1].id]
    assert await store.requeue(Selection(key="k1"), T0 + 50) == [claims[1].id]

    skipped = await store.skip_selected(phone, T0 + 60)
    assert skipped == [claims[0].id, claims[2].id]
    for claim in claims[::2]:
        view = await store.get_delivery(claim.id)
        assert view is not None
        assert view.status is Status.SKIPPED
        detail = await store.get_event(claim.event_id)
        assert detail is not None
        assert [e.kind for e in detail.log[claim.id]] == ["skip"]
    untouched = await store.get_delivery(other.id)
    assert untouched is not None
    assert untouched.status is Status.DEAD
    assert await store.skip_selected(phone, T0 + 61) == []  # nothing dead matches now
    # Pending ones too, when asked for (a batch of test payments), never in flight.
    assert await store.skip_selected(Selection(status=Status.PENDING), T0 + 62) == [claims[1].id]
    assert await store.skip_selected(Selection(status=Status.IN_FLIGHT), T0 + 62) == []


async def test_a_bulk_skip_lets_the_next_of_each_key_go(store: Store) -> None:
    keyed = [NewDelivery("crm", order_key="A")]
    first = await store.accept_event(event("a1"), keyed, T0)
    second = await store.accept_event(event("a2"), keyed, T0 + 1)
    third = await store.accept_event(event("a3"), keyed, T0 + 2)
    [head] = await store.claim_due(T0, T0 + 60, {"crm": 5})
    await record(store, head, FAILED, Dead("HTTP 422"), T0)
    # The dead head skipped, the one behind it is due; skipped too, the third.
    ids = await store.skip_selected(Selection(status=Status.DEAD, target="crm"), T0 + 10)
    assert ids == [head.id]
    [behind] = await store.claim_due(T0 + 10, T0 + 70, {"crm": 5})
    assert behind.event_id == second.event_id
    await store.release([behind.id], T0 + 11)
    named = Selection(status=Status.PENDING, ids=(behind.id,))
    assert await store.skip_selected(named, T0 + 12) == [behind.id]
    [last] = await store.claim_due(T0 + 12, T0 + 72, {"crm": 5})
    assert (last.event_id, first.event_id != last.event_id) == (third.event_id, True)


async def test_every_operator_action_is_recorded_with_who_did_it(store: Store) -> None:
    a = await _dead(store, "a", T0)
    b = await _dead(store, "b", T0 + 1)
    anna, boris = "cli user anna", "dashboard session 1a2b3c4d from 127.0.0.1"
    await store.set_paused("crm", True, T0 + 10, by=anna)
    await store.set_paused("crm", False, T0 + 11, by=anna)
    await store.retry_now(a.id, T0 + 12, by=boris)
    await store.skip(b.id, T0 + 13, by=boris)
    await store.requeue(Selection(status=Status.SKIPPED, route="orders"), T0 + 14, by=anna)
    await store.skip_selected(Selection(status=Status.PENDING), T0 + 15, by=boris)
    copy_id = await store.resend(_copy_of(a.event_id), T0 + 16)
    entries = await store.list_audit(100)
    assert [(e.at, e.by, e.action, e.subject, e.count) for e in entries] == [
        (T0 + 16, "cli user anna", "resend", f"event {a.event_id} as event {copy_id}, to crm", 1),
        (T0 + 15, boris, "skip", "pending", 2),
        (T0 + 14, anna, "requeue", "skipped, route orders", 1),
        (T0 + 13, boris, "skip", f"delivery {b.id}", 1),
        (T0 + 12, boris, "retry", f"delivery {a.id}", 1),
        (T0 + 11, anna, "resume", "target crm", 0),
        (T0 + 10, anna, "pause", "target crm", 0),
    ]
    assert entries[1].deliveries == (a.id, b.id)
    assert entries[6].deliveries == ()
    # Paged back, newest first.
    older = await store.list_audit(2, before_id=entries[4].id)
    assert [e.action for e in older] == ["resume", "pause"]
    # Each delivery's history names who acted on it.
    detail = await store.get_event(b.event_id)
    assert detail is not None
    assert [(e.kind, e.by) for e in detail.log[b.id]] == [
        ("skip", boris),
        ("requeue", anna),
        ("skip", boris),
    ]


async def test_attention_counts_the_newly_dead_and_the_held_keys(store: Store) -> None:
    old = await _dead(store, "old", T0)
    keyed = [NewDelivery("crm", order_key="ORDER-1")]
    head = await store.accept_event(event("h1"), keyed, T0 + 10)
    behind = [await store.accept_event(event(f"h{n}"), keyed, T0 + 10 + n) for n in (2, 3)]
    [claim] = await store.claim_due(T0 + 20, T0 + 80, {"crm": 5})
    assert claim.event_id == head.event_id
    await record(store, claim, FAILED, Dead("HTTP 422"), T0 + 20)
    seen = await store.attention(T0 + 15, 10)
    assert seen.dead_since == 1  # the old one went dead before the last look
    assert seen.held == (HeldKey(claim.id, head.event_id, "crm", "ORDER-1", 2),)
    assert (await store.attention(T0, 10)).dead_since == 2
    # Skipped, the head lets its key go: nothing held any more.
    await store.skip(claim.id, T0 + 30)
    assert (await store.attention(T0, 10)).held == ()
    assert behind[0].event_id != old.event_id


async def test_a_paused_target_says_since_when_and_who_paused_it(store: Store) -> None:
    """Targets, the Overview and `relay stats` say it (issue 55, item 9)."""
    await store.set_paused("crm", True, T0, by="cli user anna")
    await store.set_paused("crm", False, T0 + 5, by="cli user anna")
    await store.set_paused("crm", True, T0 + 10, by="dashboard session 1a2b from 127.0.0.1")
    await store.set_paused("mail", True, T0 + 11, by="cli user boris")
    await store.set_paused("mail", False, T0 + 12, by="cli user boris")
    states = await store.target_states()
    assert (states["crm"].paused_at, states["crm"].paused_by) == (
        T0 + 10,
        "dashboard session 1a2b from 127.0.0.1",
    )
    assert (states["mail"].paused, states["mail"].paused_at, states["mail"].paused_by) == (
        False,
        None,
        None,
    )
