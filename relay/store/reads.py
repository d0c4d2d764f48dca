"""The reads both backends do, written once: their SQL (in `?` placeholders,
turned into a backend's by its Dialect) and the mapping of their rows.

`Reads` is the read side of the store contract (the Queries role, and the
reads of the queue, operations and indexing roles). A backend inherits it and
supplies only the execution: `_read` (one statement), `_reading` (several
that must agree, in one read transaction) and `_search` (a content search,
stopped at its time limit).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, ClassVar, Protocol

from relay.store.base import (
    Arrival,
    AttemptView,
    Attention,
    AuditEntry,
    BodyHead,
    DeliveryView,
    DownState,
    EventDetail,
    EventQuery,
    EventView,
    FailingDeliveries,
    Gauges,
    HeldTargets,
    HourlyActivity,
    IndexSource,
    LogEntry,
    Rejection,
    RouteWatches,
    SearchProgress,
    Selection,
    Stats,
    Status,
    TargetState,
)
from relay.store.columns import (
    ARRIVAL,
    ATTEMPT,
    AUDIT_ENTRY,
    BODY_HEAD,
    DELIVERY,
    EVENT,
    EVENT_DETAIL,
    FAILING,
    HELD_BEHIND,
    HELD_KEY,
    INDEX_SOURCE,
    LOG_ENTRY,
    REJECTION,
    RESEND_LINK,
    ROUTE_WATCHES,
    TARGET_STATE,
)
from relay.store.dialect import Dialect
from relay.store.rhythm import ARRIVALS, LEARNT_THROUGH, RHYTHM_AT, WATCHES
from relay.store.rows import HEAD_OF_LINE, probe_choice
from relay.store.shape import Row


class Fetch(Protocol):
    """One statement of the shared SQL (`?` placeholders) and its rows."""

    async def __call__(self, sql: str, params: Sequence[Any] = (), /) -> Sequence[Row]: ...


# Per target, pending deliveries waiting behind a dead one of their ordering key
# (the relay_deliveries_held gauge); read through the ordering lines' index.
HELD_BEHIND_DEAD = """
SELECT p.target, COUNT(*) FROM deliveries p
WHERE p.order_key IS NOT NULL AND p.status = 'pending' AND EXISTS (
    SELECT 1 FROM deliveries d
    WHERE d.target = p.target AND d.order_key = p.order_key
    AND d.status = 'dead' AND d.id < p.id
)
GROUP BY p.target
"""
# Deliveries gone dead since a time, and still dead (attention).
DEAD_SINCE = "SELECT COUNT(*) FROM deliveries WHERE status = 'dead' AND updated_at >= ?"
# Ordering keys whose first unfinished delivery is dead, with how many wait.
HELD_KEYS = f"""
SELECT {HELD_KEY.columns}
FROM deliveries d
WHERE d.status = 'dead' AND d.order_key IS NOT NULL
AND d.id = (SELECT h.id FROM deliveries h WHERE h.target = d.target
    AND h.order_key = d.order_key AND h.status IN ('pending', 'in_flight', 'dead')
    ORDER BY h.id LIMIT 1)
AND EXISTS (SELECT 1 FROM deliveries w WHERE w.target = d.target
    AND w.order_key = d.order_key AND w.status = 'pending' AND w.id > d.id)
ORDER BY d.id LIMIT ?
"""
# Paused or down targets, one row each (held_targets).
HELD_TARGETS = (
    f"SELECT {TARGET_STATE.columns} FROM targets"
    " WHERE paused OR down_since IS NOT NULL OR throttles > 0"
)
# The delivery a down target's next probe takes: the one under way, else
# the one its claim will take (rows.probe_choice); every `?` the target's name.
NEXT_PROBE = (
    "SELECT coalesce((SELECT id FROM deliveries WHERE target = ? AND status = 'in_flight'"
    f" ORDER BY id LIMIT 1), {probe_choice('?', None)})"
)
# An event listing's columns: the events may be joined with the search index.
LISTED = EVENT.on("events")
LISTED_ID = LISTED.getter("events.id")
# Bodies' heads by event id.
BODY_HEADS = BODY_HEAD.keyed("id")
# The longest-waiting pending delivery's event: delivery ids grow with
# arrival, and the partial due index holds them, so the smallest is found
# without the table.
OLDEST_PENDING = (
    "SELECT e.received_at FROM events e JOIN deliveries d ON d.event_id = e.id"
    " WHERE d.id = (SELECT MIN(id) FROM deliveries WHERE status = 'pending')"
)
# An event with nothing left to deliver (retention removes only those): a
# superseded delivery is finished once the corrected copy that stands for it
# is (relay.store.supersede): till then it says which copy, and why.
FINISHED = (
    "NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id"
    " AND d.status NOT IN ('delivered', 'skipped', 'resolved')"
    " AND NOT (d.status = 'superseded' AND NOT EXISTS (SELECT 1 FROM deliveries c"
    " WHERE c.id = d.resolved_by AND c.status IN ('pending', 'in_flight', 'dead'))))"
)
# Whether what a corrected copy's delivery stands in for is in flight and
# linked to it (the copy waits for that attempt, relay.store.supersede): (id, copy)
WAITS_FOR = "SELECT 1 FROM deliveries WHERE id = ? AND resolved_by = ? AND status = 'in_flight'"
# Deliveries that keep failing: pending or in flight after at least `?`
# attempts in their cycle. The literal terms are the partial index's
# (deliveries_failing), which holds only deliveries that failed in their cycle.
KEEPS_FAILING = "status IN ('pending', 'in_flight') AND cycle_attempts > 0 AND cycle_attempts >= ?"
# The states with partial indexes: a listing collects their events directly.
RARE = (Status.PENDING, Status.IN_FLIGHT, Status.DEAD)


class Reads(ABC):
    dialect: ClassVar[Dialect]

    @abstractmethod
    async def _read(
        self, sql: str, params: Sequence[Any] = (), *, slow: bool = False
    ) -> Sequence[Row]:
        """One statement; `slow`: an operator's read, kept off the way of the
        scheduler's quick lookups where the backend can."""

    @abstractmethod
    def _reading(self) -> AbstractAsyncContextManager[Fetch]:
        """Several statements that must agree (an event, its deliveries, their
        attempts): one read transaction."""

    @abstractmethod
    async def _search(self, sql: str, params: Sequence[Any]) -> Sequence[Row]:
        """A content search's statement, stopped at the search's time limit
        (SearchTooSlow)."""

    # The queue's

    async def paused_targets(self) -> frozenset[str]:
        rows = await self._read("SELECT name FROM targets WHERE paused")
        return frozenset(name for (name,) in rows)

    async def down_targets(self) -> dict[str, DownState]:
        return (await self.held_targets()).down

    async def held_targets(self) -> HeldTargets:
        return held_targets(await self._read(HELD_TARGETS))

    # Queries

    async def list_events(self, query: EventQuery) -> list[EventView]:
        sql, params = event_listing(self.dialect, query)
        if query.search is not None:
            # On its own (one search at a time, under its time limit): a long
            # search holds no other reader's transaction behind it.
            rows = await self._search(sql, params)
            async with self._reading() as fetch:
                deliveries = await deliveries_of(fetch, self.dialect, list(map(LISTED_ID, rows)))
        else:
            async with self._reading() as fetch:
                rows = await fetch(sql, params)
                deliveries = await deliveries_of(fetch, self.dialect, list(map(LISTED_ID, rows)))
        return [
            LISTED.from_row(row, deliveries=tuple(deliveries.get(LISTED_ID(row), ())))
            for row in rows
        ]

    async def get_event(self, event_id: int) -> EventDetail | None:
        async with self._reading() as fetch:
            return await _event_detail(fetch, self.dialect, event_id)

    async def get_delivery(self, delivery_id: int) -> DeliveryView | None:
        async with self._reading() as fetch:
            rows = await fetch(
                f"SELECT {DELIVERY.columns} FROM deliveries WHERE id = ?", (delivery_id,)
            )
            views = await _with_holds(fetch, map(DELIVERY.from_row, rows))
            return views[0] if views else None

    async def target_states(self) -> dict[str, TargetState]:
        async with self._reading() as fetch:
            return await _target_states(fetch)

    async def gauges(self) -> Gauges:
        async with self._reading() as fetch:
            counts: dict[tuple[str, Status], int] = {}
            # One query per status, each reading only that status's partial index.
            for status in RARE:
                sql = "SELECT target, COUNT(*) FROM deliveries WHERE status = ? GROUP BY target"
                for target, count in await fetch(sql, (status.value,)):
                    counts[(target, status)] = count
            held = {target: count for target, count in await fetch(HELD_BEHIND_DEAD)}
            # Over the partial index of the few flagged: no scan of events.
            flagged = _value(await fetch("SELECT COUNT(*) FROM events WHERE flagged IS NOT NULL"))
            return Gauges(
                counts=counts,
                oldest_pending_received_at=await _oldest_pending(fetch),
                held=held,
                flagged=int(flagged or 0),
            )

    async def stats(self) -> Stats:
        async with self._reading() as fetch:
            by_route: dict[str, dict[Status, int]] = {}
            by_target: dict[str, dict[Status, int]] = {}
            for route, target, status, count in await fetch(
                "SELECT route, target, status, COUNT(*) FROM deliveries"
                " GROUP BY route, target, status"
            ):
                state = Status(status)
                route_counts = by_route.setdefault(route, {})
                route_counts[state] = route_counts.get(state, 0) + count
                target_counts = by_target.setdefault(target, {})
                target_counts[state] = target_counts.get(state, 0) + count
            # Past the first attempt of their cycle: what failing=1 lists.
            [(late,)] = await fetch(f"SELECT COUNT(*) FROM deliveries WHERE {KEEPS_FAILING}", (1,))
            return Stats(
                counts_by_route=by_route,
                counts_by_target=by_target,
                oldest_pending_received_at=await _oldest_pending(fetch),
                pending_after_first_attempt=int(late),
                dead=sum(counts.get(Status.DEAD, 0) for counts in by_target.values()),
                targets=await _target_states(fetch),
            )

    async def activity(self, since: float, until: float) -> list[HourlyActivity]:
        start = since - since % 3600
        slot = self.dialect.integer.format("(started_at - ?) / 3600")
        rows = await self._read(
            f"SELECT {slot} AS slot, COUNT(*),"
            " SUM(CASE WHEN outcome <> 'success' THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN outcome <> 'success' AND next_attempt_at IS NULL THEN 1 ELSE 0 END)"
            " FROM attempts WHERE started_at >= ? AND started_at < ? GROUP BY slot",
            (start, start, until),
            slow=True,
        )
        found = {slot: (attempts, failed, dead) for slot, attempts, failed, dead in rows}
        hours = int((until - start) // 3600) + 1
        return [
            HourlyActivity(start + slot * 3600, *found.get(slot, (0, 0, 0)))
            for slot in range(hours)
        ]

    async def list_rejections(
        self,
        route: str | None,
        limit: int,
        *,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Rejection]:
        sql = f"SELECT {REJECTION.columns} FROM rejections"
        where: list[str] = []
        params: list[Any] = []
        for clause, value in (("route = ?", route), ("at >= ?", since), ("at < ?", until)):
            if value is not None:
                where.append(clause)
                params.append(value)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit)
        return list(map(REJECTION.from_row, await self._read(sql, params, slow=True)))

    async def list_audit(self, limit: int, before_id: int | None = None) -> list[AuditEntry]:
        rows = await self._read(
            f"SELECT {AUDIT_ENTRY.columns} FROM audit WHERE id < ? ORDER BY id DESC LIMIT ?",
            (before_id if before_id is not None else 2**63 - 1, limit),
            slow=True,
        )
        return list(map(AUDIT_ENTRY.from_row, rows))

    async def attention(self, dead_since: float, limit: int) -> Attention:
        async with self._reading() as fetch:
            [(dead,)] = await fetch(DEAD_SINCE, (dead_since,))
            held = await fetch(HELD_KEYS, (limit,))
        return Attention(int(dead), tuple(map(HELD_KEY.from_row, held)))

    async def failing_deliveries(self, after: int, limit: int) -> FailingDeliveries:
        async with self._reading() as fetch:
            counts = await fetch(
                f"SELECT route, target, COUNT(*) FROM deliveries WHERE {KEEPS_FAILING}"
                " GROUP BY route, target",
                (after,),
            )
            rows = await fetch(
                f"SELECT {FAILING.columns} FROM deliveries WHERE {KEEPS_FAILING}"
                " ORDER BY id LIMIT ?",
                (after, limit),
            )
        return FailingDeliveries(
            counts={(route, target): int(n) for route, target, n in counts},
            first=tuple(map(FAILING.from_row, rows)),
        )

    # The Rhythms role's reads

    async def arrivals(self, after: int, limit: int) -> list[Arrival]:
        return list(map(ARRIVAL.from_row, await self._read(ARRIVALS, (after, limit), slow=True)))

    async def route_watches(self) -> RouteWatches:
        async with self._reading() as fetch:
            [(through,)] = await fetch(LEARNT_THROUGH)
            routes = dict(map(ROUTE_WATCHES.from_row, await fetch(WATCHES)))
        return RouteWatches(through=int(through), routes=routes)

    async def route_rhythm(self, slot: int, weeks: range) -> dict[str, dict[int, float]]:
        rows = await self._read(RHYTHM_AT, (slot, weeks.start, weeks.stop), slow=True)
        found: dict[str, dict[int, float]] = {}
        for route, week, seconds in rows:
            found.setdefault(route, {})[int(week)] = float(seconds)
        return found

    async def search_progress(self) -> SearchProgress:
        [(through, newest)] = await self._read(
            "SELECT (SELECT indexed_through FROM search_progress WHERE id = 1),"
            " coalesce((SELECT MAX(id) FROM events), 0)"
        )
        return SearchProgress(indexed_through=through or 0, newest=newest)

    async def body_heads(self, event_ids: Sequence[int], size: int) -> dict[int, BodyHead]:
        if not event_ids:
            return {}
        among, ids = self.dialect.any_of("id", event_ids)
        rows = await self._read(
            f"SELECT {BODY_HEADS.columns} FROM events WHERE {among}", [size, *ids], slow=True
        )
        return dict(map(BODY_HEADS.from_row, rows))

    # The operations'

    async def count(self, selection: Selection) -> int:
        where, params = selection_where(selection, self.dialect)
        [(count,)] = await self._read(
            f"SELECT COUNT(*) FROM deliveries WHERE {where}", params, slow=True
        )
        return int(count)

    async def select(self, selection: Selection, limit: int) -> list[int]:
        where, params = selection_where(selection, self.dialect)
        rows = await self._read(
            f"SELECT id FROM deliveries WHERE {where} ORDER BY id LIMIT ?",
            [*params, limit],
            slow=True,
        )
        return [int(delivery_id) for (delivery_id,) in rows]

    # Indexing's

    async def events_to_index(self, limit: int, body_limit: int) -> list[IndexSource]:
        # Only the body's first bytes leave the database: a batch of huge
        # bodies costs bounded memory.
        rows = await self._read(
            f"SELECT {INDEX_SOURCE.columns} FROM events"
            " WHERE id > (SELECT indexed_through FROM search_progress WHERE id = 1)"
            " ORDER BY id LIMIT ?",
            (body_limit, limit),
            slow=True,
        )
        return list(map(INDEX_SOURCE.from_row, rows))

    async def interrupted_indexing(self) -> int | None:
        rows = await self._read(
            "SELECT working_through FROM search_progress"
            " WHERE id = 1 AND working_through > indexed_through",
            (),
        )
        return int(rows[0][0]) if rows else None

    async def flagged_events(self, limit: int) -> list[EventView]:
        async with self._reading() as fetch:
            rows = await fetch(
                f"SELECT {LISTED.columns} FROM events WHERE flagged IS NOT NULL"
                " ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            deliveries = await deliveries_of(fetch, self.dialect, list(map(LISTED_ID, rows)))
        return [
            LISTED.from_row(row, deliveries=tuple(deliveries.get(LISTED_ID(row), ())))
            for row in rows
        ]

    # Maintenance's

    async def _purgeable(self, cutoffs: Mapping[str, float], default_cutoff: float) -> int:
        """How many events purge() would remove (its dry run)."""
        where, params = purgeable(self.dialect, cutoffs, default_cutoff)
        [(count,)] = await self._read(
            f"SELECT COUNT(*) FROM events WHERE {where}", params, slow=True
        )
        return int(count)


def event_listing(dialect: Dialect, query: EventQuery) -> tuple[str, list[Any]]:
    """The page of events `query` asks for: LISTED's columns, newest first."""
    where: list[str] = []
    params: list[Any] = []
    source, key = "events", "events.id"
    if query.search is not None:
        found = dialect.listing_search(query.search)
        source, key = found.source, found.key
        where += found.conditions
        params += found.params
    for column, value in (
        ("events.route = ?", query.route),
        ("events.received_at >= ?", query.since),
        ("events.received_at < ?", query.until),
        ("events.idempotency_key = ?", query.key),
        # With a search the index walks the ids: the cursor must bound its walk.
        (f"{key} < ?", query.before_id),
    ):
        if value is not None:
            where.append(column)
            params.append(value)
    if query.failing is not None:
        where.append(f"events.id IN (SELECT event_id FROM deliveries WHERE {KEEPS_FAILING})")
        params.append(query.failing)
    if query.status in RARE:
        sub = "SELECT event_id FROM deliveries WHERE status = ?"
        params.append(query.status.value)
        if query.target is not None:
            sub += " AND target = ?"
            params.append(query.target)
        where.append(f"events.id IN ({sub})")
    elif query.status is not None or query.target is not None:
        conditions = ["d.event_id = events.id"]
        if query.status is not None:
            conditions.append("d.status = ?")
            params.append(query.status.value)
        if query.target is not None:
            conditions.append("d.target = ?")
            params.append(query.target)
        where.append(f"EXISTS (SELECT 1 FROM deliveries d WHERE {' AND '.join(conditions)})")
    sql = f"SELECT {LISTED.columns} FROM {source}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {key} DESC LIMIT ?"
    params.append(query.limit)
    return sql, params


def selection_where(selection: Selection, dialect: Dialect) -> tuple[str, list[Any]]:
    """The WHERE of the deliveries `selection` takes (`?` placeholders)."""
    where = ["status = ?"]
    params: list[Any] = [selection.status.value]
    if selection.sendable:
        where.append("(status <> 'pending' OR next_attempt_at IS NOT NULL)")
    for clause, value in (("route = ?", selection.route), ("target = ?", selection.target)):
        if value is not None:
            where.append(clause)
            params.append(value)
    if selection.ids:
        among, ids = dialect.any_of("id", selection.ids)
        where.append(among)
        params += ids
    if selection.since is not None or selection.until is not None:
        where.append(
            "event_id IN (SELECT id FROM events WHERE received_at >= ? AND received_at < ?)"
        )
        params += [
            selection.since if selection.since is not None else float("-inf"),
            selection.until if selection.until is not None else float("inf"),
        ]
    if selection.key is not None:
        where.append("event_id IN (SELECT id FROM events WHERE idempotency_key = ?)")
        params.append(selection.key)
    if selection.search is not None:
        clause, values = dialect.search(selection.search)
        where.append(clause)
        params += values
    return " AND ".join(where), params


def purgeable(
    dialect: Dialect, cutoffs: Mapping[str, float], default_cutoff: float
) -> tuple[str, list[Any]]:
    """The WHERE of the events retention removes: received before their
    route's cutoff (a route with a longer window has an earlier one; the
    default is the latest) and finished."""
    bound = "received_at < ?"
    params: list[Any] = [default_cutoff]
    if cutoffs:
        cases = " ".join(f"WHEN ? THEN {dialect.real}" for _ in cutoffs)
        bound += f" AND received_at < CASE route {cases} ELSE {dialect.real} END"
        for route, cutoff in cutoffs.items():
            params += [route, cutoff]
        params.append(default_cutoff)
    return f"{bound} AND {FINISHED}", params


async def deliveries_of(
    fetch: Fetch, dialect: Dialect, event_ids: Sequence[int]
) -> dict[int, list[DeliveryView]]:
    """The deliveries of these events, by event, each with what it waits for."""
    result: dict[int, list[DeliveryView]] = {}
    if not event_ids:
        return result
    among, ids = dialect.any_of("event_id", event_ids)
    rows = await fetch(f"SELECT {DELIVERY.columns} FROM deliveries WHERE {among} ORDER BY id", ids)
    for view in await _with_holds(fetch, map(DELIVERY.from_row, rows)):
        result.setdefault(view.event_id, []).append(view)
    return result


async def _with_holds(fetch: Fetch, views: Iterable[DeliveryView]) -> list[DeliveryView]:
    """Say what each delivery waiting its turn waits for, and each corrected
    copy's waiting for an attempt of its original (one index probe each)."""
    result = []
    for view in views:
        if view.waiting_turn:
            head = await fetch(HEAD_OF_LINE, (view.target, view.order_key))
            held = HELD_BEHIND.from_row(head[0]) if head else None
            if held is not None and held.delivery_id != view.id:
                view = replace(view, held_behind=held)
        copy = view.status is Status.PENDING and view.resolves is not None
        if copy and await fetch(WAITS_FOR, (view.resolves, view.id)):
            view = replace(view, waits_for=view.resolves)
        result.append(view)
    return result


async def _event_detail(fetch: Fetch, dialect: Dialect, event_id: int) -> EventDetail | None:
    rows = await fetch(f"SELECT {EVENT_DETAIL.columns} FROM events WHERE id = ?", (event_id,))
    if not rows:
        return None
    deliveries = tuple((await deliveries_of(fetch, dialect, [event_id])).get(event_id, ()))
    attempts: dict[int, list[AttemptView]] = {delivery.id: [] for delivery in deliveries}
    log: dict[int, list[LogEntry]] = {delivery.id: [] for delivery in deliveries}
    if deliveries:
        among, ids = dialect.any_of("delivery_id", list(attempts))
        sql = f"SELECT {ATTEMPT.columns} FROM attempts WHERE {among} ORDER BY id"
        for attempt in map(ATTEMPT.from_row, await fetch(sql, ids)):
            attempts[attempt.delivery_id].append(attempt)
        sql = f"SELECT {LOG_ENTRY.columns} FROM delivery_log WHERE {among} ORDER BY id"
        for entry in map(LOG_ENTRY.from_row, await fetch(sql, ids)):
            log[entry.delivery_id].append(entry)
    sql = f"SELECT {RESEND_LINK.columns} FROM resends WHERE copy_id = ? OR original_id = ?"
    resends = list(
        map(RESEND_LINK.from_row, await fetch(f"{sql} ORDER BY copy_id", (event_id,) * 2))
    )
    return EVENT_DETAIL.from_row(
        rows[0],
        deliveries=deliveries,
        attempts={key: tuple(value) for key, value in attempts.items()},
        log={key: tuple(value) for key, value in log.items()},
        resent_from=next((link for link in resends if link.copy_id == event_id), None),
        resent_as=tuple(link for link in resends if link.original_id == event_id),
    )


async def _target_states(fetch: Fetch) -> dict[str, TargetState]:
    states = {}
    rows = await fetch(f"SELECT {TARGET_STATE.columns} FROM targets")
    for state in map(TARGET_STATE.from_row, rows):
        if state.down is not None:  # down: which delivery its next probe takes
            names = (state.name,) * NEXT_PROBE.count("?")
            probe = _value(await fetch(NEXT_PROBE, names))
            state = replace(state, down=replace(state.down, next_probe=probe))
        states[state.name] = state
    return states


async def _oldest_pending(fetch: Fetch) -> float | None:
    received = _value(await fetch(OLDEST_PENDING))
    return float(received) if received is not None else None


def _value(rows: Sequence[Row]) -> Any:
    """The one value of a query of one column and at most one row (None without)."""
    for (value,) in rows:
        return value
    return None


def held_targets(rows: Iterable[Row]) -> HeldTargets:
    """Paused, down and throttled targets, from rows of TARGET_STATE."""
    states = list(map(TARGET_STATE.from_row, rows))
    return HeldTargets(
        paused=frozenset(state.name for state in states if state.paused),
        down={state.name: state.down for state in states if state.down is not None},
        # In a throttle's episode: held, or to send one request alone.
        throttled={
            state.name: state.throttled_until
            for state in states
            if state.throttled_until is not None and state.throttles > 0
        },
    )
