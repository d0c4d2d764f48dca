"""Store contract, the Queries role (reading, never changing): list_events,
get_event, get_delivery, target_states, gauges, stats, activity,
list_rejections, search_progress; with the Intake verb that feeds the
rejections and the Indexing verbs that feed search. Runs over every backend
(tests/store_backends.py)."""

from __future__ import annotations

from relay.store import (
    AttemptRecord,
    Dead,
    Delivered,
    EventQuery,
    NewDelivery,
    Rejection,
    RetryAt,
    SearchDocument,
    SearchProgress,
    Selection,
    Status,
    Store,
    TextSearch,
    Transition,
)
from relay.store.base import REJECTIONS_KEPT

from helpers import record
from samples import T0, TWO, event


async def test_nothing_found_is_none_not_an_error(store: Store) -> None:
    assert await store.get_event(1) is None
    assert await store.get_delivery(1) is None
    assert await store.list_events(EventQuery()) == []
    assert await store.target_states() == {}
    assert await store.list_rejections(None, 10) == []


async def test_an_event_starts_with_deliveries_skipped_or_dead_for_a_reason(store: Store) -> None:
    accepted = await store.accept_event(
        event(),
        [
            NewDelivery("crm"),
            NewDelivery("audit", Status.SKIPPED, "when: route != 'orders'"),
            NewDelivery("mail", Status.DEAD, "template error: 'x' is undefined"),
        ],
        T0,
    )
    detail = await store.get_event(accepted.event_id)
    assert detail is not None
    assert [
        (d.target, d.status, d.last_error, d.next_attempt_at) for d in detail.event.deliveries
    ] == [
        ("crm", Status.PENDING, None, T0),
        ("audit", Status.SKIPPED, "when: route != 'orders'", None),
        ("mail", Status.DEAD, "template error: 'x' is undefined", None),
    ]
    assert detail.event.status is Status.DEAD
    assert (detail.event.route, detail.event.received_at, detail.event.remote_addr) == (
        "orders",
        T0,
        "127.0.0.1",
    )
    assert (detail.payload.method, detail.payload.path, detail.payload.content_type) == (
        "POST",
        "/hooks/orders",
        "application/json",
    )
    assert detail.resent_from is None
    assert detail.resent_as == ()
    assert all(detail.attempts[d.id] == () for d in detail.event.deliveries)


async def test_list_events_by_status_and_target(store: Store) -> None:
    a = await store.accept_event(event("a"), TWO, T0)
    b = await store.accept_event(event("b"), [NewDelivery("crm")], T0 + 1)
    claims = {c.event_id: c for c in await store.claim_due(T0 + 1, T0 + 61, {"crm": 2})}
    await record(
        store, claims[a.event_id], AttemptRecord(1, T0, 0.01, "fail", 400, "x"), Dead("x"), T0
    )
    keys = lambda events: [e.idempotency_key for e in events]  # noqa: E731
    assert keys(await store.list_events(EventQuery(status=Status.DEAD))) == ["a"]
    assert keys(await store.list_events(EventQuery(status=Status.IN_FLIGHT))) == ["b"]
    assert keys(await store.list_events(EventQuery(status=Status.PENDING))) == ["a"]  # audit
    assert keys(await store.list_events(EventQuery(status=Status.PENDING, target="crm"))) == []
    assert keys(await store.list_events(EventQuery(target="audit"))) == ["a"]
    assert keys(await store.list_events(EventQuery(status=Status.DELIVERED))) == []
    assert keys(await store.list_events(EventQuery(route="leads"))) == []
    assert b.event_id > a.event_id


async def test_search_finds_indexed_events_by_words_and_digits(store: Store) -> None:
    ids = []
    for i, key in enumerate(("ivan", "maria", "oleg")):
        ids.append((await store.accept_event(event(key, at=T0 + i), TWO, T0 + i)).event_id)
    assert await store.search_progress() == SearchProgress(indexed_through=0, newest=ids[-1])
    sources = await store.events_to_index(limit=2, body_limit=3)
    assert [s.event_id for s in sources] == ids[:2]  # the oldest first
    assert all(s.body == b'{"a' for s in sources)  # cut to body_limit
    assert (sources[0].query, sources[0].content_type) == ("x=1", "application/json")
    assert sources[0].headers[0] == ("Content-Type", "application/json")
    await store.index_events(
        [
            SearchDocument(ids[0], "ivan petrov, moscow", "79001234567"),
            SearchDocument(ids[1], "maria ivanova, kazan", "79007654321"),
        ],
        through=ids[1],
    )
    progress = await store.search_progress()
    assert (progress.indexed_through, progress.behind) == (ids[1], 1)
    assert [s.event_id for s in await store.events_to_index(10, 100)] == [ids[2]]

    async def search(search: TextSearch, **more: object) -> list[int]:
        events = await store.list_events(EventQuery(search=search, **more))  # type: ignore[arg-type]
        return [ids.index(e.id) for e in events]

    assert await search(TextSearch(words=("ivan",))) == [1, 0]  # newest first
    assert await search(TextSearch(words=("ivan", "kazan"))) == [1]  # every word
    assert await search(TextSearch(digits="9001234")) == [0]
    assert await search(TextSearch(words=("oleg",))) == []  # not indexed yet
    assert await search(TextSearch(words=("ivan",)), before_id=ids[1]) == [0]
    assert await search(TextSearch(words=("ivan",)), limit=1) == [1]
    assert await search(TextSearch(words=("ivan",)), key="ivan") == [0]


async def test_rejections_keep_the_newest_per_route(store: Store) -> None:
    def refused(route: str, i: int) -> Rejection:
        return Rejection(route, T0 + i, "10.0.0.1", "signature", f"try {i}", [("X-Sig", "***")])

    for i in range(REJECTIONS_KEPT + 5):
        await store.record_rejection(refused("orders", i))
    await store.record_rejection(refused("leads", 0))
    orders = await store.list_rejections("orders", 1000)
    assert len(orders) == REJECTIONS_KEPT
    assert orders[0] == refused("orders", REJECTIONS_KEPT + 4)  # newest first
    assert orders[-1].detail == "try 5"
    assert list(orders[0].headers) == [("X-Sig", "***")]
    assert [r.route for r in await store.list_rejections("leads", 10)] == ["leads"]
    assert len(await store.list_rejections(None, 3)) == 3
    assert {r.route for r in await store.list_rejections(None, 1000)} == {"orders", "leads"}
    # A time window: since inclusive, until exclusive (`relay rejections --since`).
    window = await store.list_rejections("orders", 1000, since=T0 + 10, until=T0 + 12)
    assert [r.detail for r in window] == ["try 11", "try 10"]
    assert await store.list_rejections(None, 1000, since=T0 + 1000) == []


async def test_stats_gauges_and_target_states_agree(store: Store) -> None:
    await store.accept_event(event("a", at=T0), TWO, T0)
    await store.accept_event(event("b", route="leads", at=T0 + 5), TWO, T0 + 5)
    await store.accept_event(event("c", at=T0 + 9), [NewDelivery("crm", Status.SKIPPED)], T0 + 9)
    claims = sorted(
        await store.claim_due(T0 + 10, T0 + 70, {"crm": 2, "audit": 1}), key=lambda c: c.id
    )
    crm_a, audit_a, crm_b = claims
    await record(store, crm_a, AttemptRecord(1, T0 + 10, 0.1, "success", 200), Delivered(), T0 + 10)
    await record(
        store,
        audit_a,
        AttemptRecord(1, T0 + 10, 0.1, "fail", 400, "HTTP 400"),
        Dead("HTTP 400"),
        T0 + 10,
    )
    await record(
        store,
        crm_b,
        AttemptRecord(1, T0 + 10, 0.1, "retry", 503, "HTTP 503"),
        RetryAt(T0 + 20),
        T0 + 10,
    )
    # Now: a/crm delivered, a/audit dead, b/crm pending after an attempt,
    # b/audit pending, c/crm skipped.
    stats = await store.stats()
    assert stats.counts_by_route == {
        "orders": {Status.DELIVERED: 1, Status.DEAD: 1, Status.SKIPPED: 1},
        "leads": {Status.PENDING: 2},
    }
    assert stats.counts_by_target == {
        "crm": {Status.DELIVERED: 1, Status.PENDING: 1, Status.SKIPPED: 1},
        "audit": {Status.DEAD: 1, Status.PENDING: 1},
    }
    assert stats.oldest_pending_received_at == T0 + 5
    assert (stats.pending_after_first_attempt, stats.dead) == (1, 1)
    assert stats.targets["crm"].consecutive_failures == 1
    assert stats.targets["audit"].last_error == "HTTP 400"
    gauges = await store.gauges()
    assert gauges.counts == {
        ("crm", Status.PENDING): 1,
        ("audit", Status.PENDING): 1,
        ("audit", Status.DEAD): 1,
    }
    assert gauges.oldest_pending_received_at == T0 + 5
    states = await store.target_states()
    assert states == stats.targets
    assert (states["crm"].last_success_at, states["crm"].last_error_at) == (T0 + 10, T0 + 10)
    assert not states["crm"].paused


async def test_activity_counts_attempts_failures_and_deaths_per_hour(store: Store) -> None:
    hour = T0 - T0 % 3600
    for i in range(3):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], hour)
    claims = await store.claim_due(hour, hour + 60, {"crm": 3})
    await record(
        store, claims[0], AttemptRecord(1, hour + 10, 0.1, "success", 200), Delivered(), hour + 10
    )
    await record(
        store,
        claims[1],
        AttemptRecord(1, hour + 20, 0.1, "retry", 503, "x"),
        RetryAt(hour + 3700),
        hour + 20,
    )
    await record(
        store,
        claims[2],
        AttemptRecord(1, hour + 3610, 0.1, "fail", 400, "x"),
        Dead("x"),
        hour + 3610,
    )
    hours = await store.activity(hour + 5, hour + 2 * 3600 + 5)
    assert [(h.hour, h.attempts, h.failed, h.dead) for h in hours] == [
        (hour, 2, 1, 0),
        (hour + 3600, 1, 1, 1),
        (hour + 7200, 0, 0, 0),
    ]


async def test_body_heads_are_the_first_bytes_and_the_whole_size(store: Store) -> None:
    """What a listing reads to say whom an event is about (relay.ops.glance)."""
    big = b'{"name": "Anna", "pad": "' + b"x" * 5000 + b'"}'
    first = await store.accept_event(event("a", body=big), TWO, T0)
    second = await store.accept_event(event("b"), TWO, T0)
    heads = await store.body_heads([first.event_id, second.event_id, 10_000], 100)
    assert set(heads) == {first.event_id, second.event_id}  # a gone id is left out
    assert heads[first.event_id].head == big[:100]
    assert heads[first.event_id].size == len(big)
    assert heads[first.event_id].content_type == "application/json"
    assert heads[first.event_id].query == "x=1"
    assert heads[second.event_id].head == b'{"a": 1}'
    assert await store.body_heads([], 100) == {}


async def test_deliveries_that_keep_failing_are_counted_listed_and_filtered(store: Store) -> None:
    # On route leads: crm's delivery fails three attempts of its cycle, mail's
    # once, audit's is delivered; sheet's fails three, goes dead and is
    # requeued: a cycle of its own, it keeps failing no more.
    targets = [NewDelivery(name) for name in ("crm", "mail", "audit", "sheet")]
    accepted = await store.accept_event(event("lead", route="leads"), targets, T0)
    failed = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")

    async def attempt(target: str, at: float, then: Transition) -> int:
        [claim] = await store.claim_due(at, at + 60, {target: 1})
        ok = isinstance(then, Delivered)
        await record(
            store, claim, AttemptRecord(1, at, 0.01, "success", 200) if ok else failed, then, at
        )
        return claim.id

    for at in (T0, T0 + 2, T0 + 6):
        crm = await attempt("crm", at, RetryAt(at + 2 if at < T0 + 6 else at + 8))
        await attempt("sheet", at, RetryAt(at + 2) if at < T0 + 6 else Dead("gave up"))
    await attempt("mail", T0, RetryAt(T0 + 2))
    await attempt("audit", T0, Delivered())
    await store.requeue(Selection(target="sheet"), T0 + 10)

    found = await store.failing_deliveries(3, 10)
    assert found.counts == {("leads", "crm"): 1}
    [shown] = found.first
    assert (shown.route, shown.delivery.id, shown.delivery.attempts_in_cycle) == ("leads", crm, 3)
    assert shown.delivery.last_error == "HTTP 503"
    assert (await store.failing_deliveries(1, 10)).counts == {
        ("leads", "crm"): 1,
        ("leads", "mail"): 1,
    }
    assert [f.delivery.id for f in (await store.failing_deliveries(1, 1)).first] == [crm]
    assert (await store.failing_deliveries(4, 10)).total == 0
    assert [e.id for e in await store.list_events(EventQuery(failing=3))] == [accepted.event_id]
    assert await store.list_events(EventQuery(failing=4)) == []
    assert (await store.stats()).pending_after_first_attempt == 2
    # In flight, it keeps failing still; its success ends it.
    [claim] = await store.claim_due(T0 + 20, T0 + 80, {"crm": 1})
    assert (await store.failing_deliveries(3, 10)).total == 1
    await record(store, claim, AttemptRecord(4, T0 + 20, 0.01, "success", 200), Delivered(), T0)
    assert (await store.failing_deliveries(3, 10)).total == 0
