"""Store contract, the Rhythms role (what the silence watch learns and keeps,
relay.background.silence): arrivals, route_watches, route_rhythm,
learn_rhythm, mark_silent. Runs over every backend (tests/store_backends.py)."""

from __future__ import annotations

from relay.store import Learned, NewDelivery, RouteWatch, Store

from samples import T0, event


async def test_events_are_learnt_from_in_order_and_what_is_learnt_is_kept(store: Store) -> None:
    for i, route in enumerate(("shop", "forms", "shop")):
        await store.accept_event(event(f"k{i}", route=route, at=T0 + i), [NewDelivery("crm")], T0)
    arrivals = await store.arrivals(0, 2)
    assert [(a.route, a.received_at) for a in arrivals] == [("shop", T0), ("forms", T0 + 1)]
    [last] = await store.arrivals(arrivals[-1].id, 10)
    assert (last.route, last.received_at) == ("shop", T0 + 2)
    assert await store.arrivals(last.id, 10) == []

    nothing = await store.route_watches()
    assert (nothing.through, nothing.routes) == (0, {})
    back = await store.learn_rhythm(
        Learned(
            through=last.id,
            seen={"shop": (T0, T0 + 2), "forms": (T0 + 1, T0 + 1)},
            longest={("shop", 10, 5): 2.0, ("shop", 9, 5): 50.0, ("shop", 10, 6): 7.0},
            keep_from_week=9,
        )
    )
    assert back == {}
    watches = await store.route_watches()
    assert watches.through == last.id
    assert watches.routes == {
        "shop": RouteWatch(T0, T0 + 2),
        "forms": RouteWatch(T0 + 1, T0 + 1),
    }
    assert await store.route_rhythm(5, range(9, 11)) == {"shop": {9: 50.0, 10: 2.0}}
    assert await store.route_rhythm(5, range(10, 11)) == {"shop": {10: 2.0}}

    # The next pass: the larger silence kept, the first and last events
    # widened, weeks before the first kept gone, progress never back.
    await store.learn_rhythm(
        Learned(
            through=last.id - 1,
            seen={"shop": (T0 - 5, T0 + 9)},
            longest={("shop", 10, 5): 1.0, ("shop", 10, 6): 9.0},
            keep_from_week=10,
        )
    )
    watches = await store.route_watches()
    assert watches.through == last.id
    assert watches.routes["shop"] == RouteWatch(T0 - 5, T0 + 9)
    assert await store.route_rhythm(5, range(0, 99)) == {"shop": {10: 2.0}}
    assert await store.route_rhythm(6, range(0, 99)) == {"shop": {10: 9.0}}


async def test_a_route_is_said_silent_once_and_back_once(store: Store) -> None:
    await store.learn_rhythm(Learned(through=0, seen={"shop": (T0, T0 + 60)}, longest={}))
    assert await store.mark_silent("shop", T0 + 3600, 600.0, 1800.0) is True
    assert await store.mark_silent("shop", T0 + 3660, 600.0, 1800.0) is False  # said already
    assert await store.mark_silent("nowhere", T0, None, 1800.0) is False  # never received
    silent = RouteWatch(T0, T0 + 60, silent_since=T0 + 3600, usual=600.0, limit=1800.0)
    assert (await store.route_watches()).routes == {"shop": silent}

    back = await store.learn_rhythm(
        Learned(through=0, seen={"shop": (T0, T0 + 7200)}, longest={}, back=("shop", "forms"))
    )
    assert back == {"shop": silent}  # as it was, its last event before the silence
    assert (await store.route_watches()).routes == {"shop": RouteWatch(T0, T0 + 7200)}
    again = await store.learn_rhythm(Learned(through=0, seen={}, longest={}, back=("shop",)))
    assert again == {}
