"""Store contract, the Streaks role: a route's failed attempts in a row at a
target, counted in runs (count_runs) and read back (route_streaks), kept
across a restart; on a shared database, the cluster's. Runs over every
backend (tests/store_backends.py)."""

from __future__ import annotations

from relay.store import RouteRun, RouteStreak, Store

from samples import T0
from store_backends import Harness


async def test_runs_count_in_order_and_a_success_ends_the_streak(store: Store) -> None:
    assert await store.count_runs([], T0) == []
    runs = [
        RouteRun("leads", "crm", 3, "HTTP 422"),
        RouteRun("orders", "crm"),  # another route's success ends nothing of leads'
        RouteRun("leads", "crm", 2, "HTTP 503"),
    ]
    assert await store.count_runs(runs, T0) == [(0, 3), (0, 0), (3, 5)]
    assert await store.route_streaks() == {("leads", "crm"): RouteStreak(5, "HTTP 503")}
    ended = [RouteRun("leads", "crm"), RouteRun("leads", "crm", 1, "timeout")]
    assert await store.count_runs(ended, T0 + 1) == [(5, 0), (0, 1)]
    assert await store.route_streaks() == {("leads", "crm"): RouteStreak(1, "timeout")}
    assert await store.count_runs([RouteRun("leads", "crm")], T0 + 2) == [(1, 0)]
    assert await store.route_streaks() == {}
    # Successes on routes that are not failing change nothing.
    assert await store.count_runs([RouteRun("leads", "crm")] * 2, T0 + 3) == [(0, 0), (0, 0)]


async def test_a_streak_outlives_a_restart(backend: Harness) -> None:
    store = await backend.open()
    await store.count_runs([RouteRun("leads", "crm", 4, "HTTP 503")], T0)
    store = await backend.restart(store)
    assert await store.route_streaks() == {("leads", "crm"): RouteStreak(4, "HTTP 503")}
    assert await store.count_runs([RouteRun("leads", "crm")], T0 + 1) == [(4, 0)]


async def test_two_stores_on_one_database_count_into_one_streak(backend: Harness) -> None:
    """On a shared database each instance's runs add to the same streak (on
    SQLite only one process serves a database: the same rule, one writer)."""
    first, second = await backend.open(), await backend.open()
    await first.count_runs([RouteRun("leads", "crm", 2, "HTTP 503")], T0)
    assert await second.count_runs([RouteRun("leads", "crm", 1, "HTTP 502")], T0 + 1) == [(2, 3)]
    assert await first.count_runs([RouteRun("leads", "crm")], T0 + 2) == [(3, 0)]
    assert await second.route_streaks() == {}
