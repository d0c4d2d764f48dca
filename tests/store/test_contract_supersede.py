"""Store contract: a corrected copy stops its original's delivery to each of
its targets (relay.store.supersede): pending or dead at once, in flight once
that attempt ends, however it ends; down a chain of copies; in its key's
line; through retention. Runs over every backend (tests/store_backends.py)."""

from __future__ import annotations

import asyncio

import pytest

from relay.store import (
    AttemptRecord,
    ClaimedDelivery,
    Dead,
    Delivered,
    DeliveryView,
    NewDelivery,
    Resend,
    RetryAt,
    Selection,
    Status,
    Store,
    Superseded,
    Transition,
)

from helpers import record, recorded
from samples import T0, TWO, event
from store_backends import Harness

FAILED = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")


def _ok(at: float, number: int = 1) -> AttemptRecord:
    return AttemptRecord(number, at, 0.01, "success", 200)


def _copy_of(event_id: int, targets: tuple[str, ...] = ("crm",)) -> Resend:
    return Resend(
        event_id, (), b'{"phone": "+7 900"}', "application/json", targets, "cli user anna"
    )


async def _in_flight(store: Store, key: str = "k") -> ClaimedDelivery:
    """A crm delivery whose first attempt is under way."""
    await store.accept_event(event(key), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    return claim


async def _view(store: Store, delivery_id: int) -> DeliveryView:
    view = await store.get_delivery(delivery_id)
    assert view is not None
    return view


async def _copy_delivery(store: Store, copy_id: int) -> DeliveryView:
    detail = await store.get_event(copy_id)
    assert detail is not None
    [delivery] = detail.event.deliveries
    return delivery


async def _history(store: Store, delivery: DeliveryView) -> list[str]:
    detail = await store.get_event(delivery.event_id)
    assert detail is not None
    return [entry.kind for entry in detail.log[delivery.id]]


async def test_a_copy_made_while_the_original_is_attempted_waits_and_is_skipped_if_it_succeeds(
    store: Store,
) -> None:
    attempt = await _in_flight(store)
    copy = await _copy_delivery(store, await store.resend(_copy_of(attempt.event_id), T0 + 1))
    # Linked both ways at once; the copy waits for the attempt under way.
    assert (copy.status, copy.resolves, copy.waits_for) == (Status.PENDING, attempt.id, attempt.id)
    original = await _view(store, attempt.id)
    assert (original.status, original.resolved_by) == (Status.IN_FLIGHT, copy.id)
    assert await store.claim_due(T0 + 2, T0 + 62, {"crm": 5}) == []
    assert await store.next_due(["crm"]) == {"crm": T0 + 60}  # the lease's end, not the copy

    step = await recorded(store, attempt, _ok(T0 + 3), Delivered(), T0 + 3)
    assert isinstance(step.then, Delivered)
    original = await _view(store, attempt.id)
    assert (original.status, original.resolved_by) == (Status.DELIVERED, None)
    assert await _history(store, original) == ["copy", "copy"]
    copy = await _view(store, copy.id)
    assert copy.status is Status.SKIPPED
    assert f"delivery {attempt.id}, the original, was delivered" in (copy.last_error or "")
    assert await _history(store, copy) == ["skip"]
    assert await store.claim_due(T0 + 4, T0 + 64, {"crm": 5}) == []
    assert (await store.stats()).counts_by_target["crm"] == {
        Status.DELIVERED: 1,
        Status.SKIPPED: 1,
    }


async def test_a_copy_made_while_the_original_is_attempted_goes_if_that_attempt_fails(
    store: Store,
) -> None:
    attempt = await _in_flight(store)
    copy = await _copy_delivery(store, await store.resend(_copy_of(attempt.event_id), T0 + 1))
    step = await recorded(store, attempt, FAILED, RetryAt(T0 + 100), T0 + 3)
    # The attempt is kept as it happened; its delivery stops, the copy goes.
    assert step.then == Superseded(copy.id)
    original = await _view(store, attempt.id)
    assert (original.status, original.resolved_by, original.next_attempt_at) == (
        Status.SUPERSEDED,
        copy.id,
        None,
    )
    assert original.attempts == 1
    assert await _history(store, original) == ["copy", "superseded"]
    [claim] = await store.claim_due(T0 + 4, T0 + 64, {"crm": 5})
    assert claim.id == copy.id
    # The copy dead, the original stays stopped and names it.
    await recorded(store, claim, FAILED, RetryAt(T0 + 100), T0 + 5)
    assert await store.claim_due(T0 + 100, T0 + 160, {"crm": 5}) != []  # the copy's retry
    original = await _view(store, attempt.id)
    assert (original.status, original.resolved_by) == (Status.SUPERSEDED, copy.id)


async def test_a_copy_made_while_a_run_of_successes_is_recorded_is_skipped(
    store: Store,
) -> None:
    # Successes recorded together on a target that is up are written in bulk
    # (SQLite's run of them, PostgreSQL's one statement): one of them had a
    # copy made meanwhile.
    for n in range(5):
        await store.accept_event(event(f"k{n}"), [NewDelivery("crm")], T0)
    first, *claims = await store.claim_due(T0, T0 + 60, {"crm": 5})
    await record(store, first, _ok(T0), Delivered(), T0)  # crm is known, and up
    copy = await _copy_delivery(store, await store.resend(_copy_of(claims[1].event_id), T0 + 1))
    await asyncio.gather(
        *(record(store, claim, _ok(T0 + 2), Delivered(), T0 + 2) for claim in claims)
    )
    copy = await _view(store, copy.id)
    assert copy.status is Status.SKIPPED
    assert (await _view(store, claims[1].id)).resolved_by is None
    assert await store.claim_due(T0 + 3, T0 + 63, {"crm": 5}) == []


async def test_an_attempt_given_back_unfinished_ends_as_failed_when_a_copy_waits(
    backend: Harness,
) -> None:
    store = await backend.open()
    cut = await _in_flight(store, "cut")
    await store.accept_event(event("other"), [NewDelivery("crm")], T0)
    [other] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    copy = await _copy_delivery(store, await store.resend(_copy_of(cut.event_id), T0 + 1))
    # relay stops with both under way: the one a copy waits for is never
    # attempted again (it may have gone out; the copy is what goes now).
    await store.release([cut.id, other.id], T0 + 2)
    stopped = await _view(store, cut.id)
    assert (stopped.status, stopped.attempts) == (Status.SUPERSEDED, 0)
    assert await _history(store, stopped) == ["copy", "superseded"]
    claims = await store.claim_due(T0 + 3, T0 + 63, {"crm": 5})
    assert sorted(c.id for c in claims) == sorted([copy.id, other.id])

    # relay dies with one under way: the next start ends it as interrupted.
    crashed = await _in_flight(store, "crashed")
    second = await _copy_delivery(store, await store.resend(_copy_of(crashed.event_id), T0 + 4))
    store = await backend.restart(store)
    later = T0 + 3600
    await store.recover_orphans(later)
    stopped = await _view(store, crashed.id)
    assert (stopped.status, stopped.attempts) == (Status.SUPERSEDED, 1)
    claims = await store.claim_due(later, later + 60, {"crm": 5})
    assert second.id in {c.id for c in claims}
    assert crashed.id not in {c.id for c in claims}


async def test_a_second_copy_stops_the_first_never_the_original_again(store: Store) -> None:
    await store.accept_event(event("k"), [NewDelivery("crm")], T0)
    [original] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, original, FAILED, RetryAt(T0 + 100), T0)
    first = await _copy_delivery(store, await store.resend(_copy_of(original.event_id), T0 + 1))
    # A second corrected copy of the original itself: the first copy, pending
    # (the one that would go), is what it stops.
    second = await _copy_delivery(store, await store.resend(_copy_of(original.event_id), T0 + 2))
    assert second.resolves == first.id
    first = await _view(store, first.id)
    assert (first.status, first.resolved_by) == (Status.SUPERSEDED, second.id)
    [claim] = await store.claim_due(T0 + 3, T0 + 63, {"crm": 5})
    assert claim.id == second.id
    await record(store, claim, _ok(T0 + 4), Delivered(), T0 + 4)
    for stopped in (original.id, first.id):
        view = await _view(store, stopped)
        assert (view.status, view.resolved_by) == (Status.RESOLVED, second.id)


async def test_two_copies_made_during_one_attempt_leave_one_to_go(store: Store) -> None:
    attempt = await _in_flight(store)
    first = await _copy_delivery(store, await store.resend(_copy_of(attempt.event_id), T0 + 1))
    second = await _copy_delivery(store, await store.resend(_copy_of(attempt.event_id), T0 + 2))
    first = await _view(store, first.id)
    assert (first.status, first.resolved_by) == (Status.SUPERSEDED, second.id)
    assert (await _view(store, attempt.id)).resolved_by == second.id
    await recorded(store, attempt, FAILED, RetryAt(T0 + 100), T0 + 3)
    [claim] = await store.claim_due(T0 + 4, T0 + 64, {"crm": 5})
    assert claim.id == second.id


async def test_a_superseded_head_lets_its_line_move(store: Store) -> None:
    for n in range(2):
        await store.accept_event(event(f"o{n}"), [NewDelivery("crm", order_key="A")], T0 + n)
    [head] = await store.claim_due(T0 + 5, T0 + 65, {"crm": 5})
    await record(store, head, FAILED, RetryAt(T0 + 1000), T0 + 5)
    assert await store.claim_due(T0 + 6, T0 + 66, {"crm": 5}) == []  # the second waits its turn
    copy = await _copy_delivery(store, await store.resend(_copy_of(head.event_id), T0 + 7))
    claims = await store.claim_due(T0 + 8, T0 + 68, {"crm": 5})
    # The copy (outside the line, as any resend) and the line's next, at once.
    assert copy.id in {c.id for c in claims}
    assert len(claims) == 2


async def test_retention_keeps_a_superseded_delivery_while_its_copy_is_unfinished(
    store: Store,
) -> None:
    await store.accept_event(event("k"), [NewDelivery("crm")], T0)
    [original] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(
        store, original, AttemptRecord(1, T0, 0.01, "fail", 422, "422"), Dead("HTTP 422"), T0
    )
    copy_id = await store.resend(_copy_of(original.event_id), T0 + 1)
    late = T0 + 10**6
    assert await store.purge({}, late, limit=10, dry_run=True) == 0
    [claim] = await store.claim_due(T0 + 2, T0 + 62, {"crm": 1})
    await record(
        store, claim, AttemptRecord(1, T0, 0.01, "fail", 422, "422"), Dead("HTTP 422"), T0 + 2
    )
    assert await store.purge({}, late, limit=10, dry_run=True) == 0  # the copy is dead
    await store.skip(claim.id, T0 + 3)  # a person gives up on it: both are finished
    assert await store.purge({}, late, limit=10, dry_run=False) == 2
    assert await store.get_event(copy_id) is None


@pytest.mark.parametrize("was", ["dead", "pending"])
async def test_the_audit_and_history_say_what_a_copy_superseded(store: Store, was: str) -> None:
    await store.accept_event(event("k"), TWO, T0)
    crm, _ = sorted(await store.claim_due(T0, T0 + 60, {"crm": 1, "audit": 1}), key=str)
    then: Transition = Dead("HTTP 422") if was == "dead" else RetryAt(T0 + 100)
    await record(store, crm, FAILED, then, T0)
    copy_id = await store.resend(_copy_of(crm.event_id), T0 + 1)
    copy = await _copy_delivery(store, copy_id)
    [entry] = await store.list_audit(1)
    assert (
        entry.subject
        == f"event {crm.event_id} as event {copy_id}, to crm; stands in for delivery {crm.id}"
    )
    assert sorted(entry.deliveries) == sorted([copy.id, crm.id])
    detail = await store.get_event(crm.event_id)
    assert detail is not None
    [line] = detail.log[crm.id]
    assert (line.kind, line.by) == ("superseded", "cli user anna")
    assert f"(was {was}): delivery {copy.id} of event {copy_id}" in (line.detail or "")
    assert (await store.stats()).dead == 0
    assert await store.requeue(Selection(ids=(crm.id,)), T0 + 2) == []
