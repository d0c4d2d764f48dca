"""A stored event cannot stop relay: what the search indexer is on is said
before it reads it, and an event relay stopped on is skipped and flagged at
the next start, shown and alerted (relay.background.indexer).

The state a killed process leaves is made here as such a process leaves it
in the file (the mark written, the index not): what the next start does with
it is what is tested, with a real store, relay and alert target.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import aiohttp

from relay.core.clock import FakeClock
from relay.ops.search import parse_search
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import RelayProcess, arelay_json, post_accepted, write_config

ROUTES = {"leads": {"path": "/hooks/leads", "targets": ["crm"]}}


def killed_while_reading(database: Path, first: int, through: int) -> None:
    """The file as a relay killed while its indexer read events `first`
    through `through` leaves it: the mark written, none of them indexed."""
    with sqlite3.connect(database) as db:
        db.execute(
            "UPDATE search_progress SET indexed_through = ?, working_through = ? WHERE id = 1",
            (first - 1, through),
        )


async def test_an_event_relay_stopped_on_is_skipped_flagged_shown_and_alerted(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    _crm, crm_url = await start_sink([200])
    ops, ops_url = await start_sink([200])
    targets = {"crm": {"type": "http", "url": crm_url}, "ops": {"type": "http", "url": ops_url}}
    config = make_config(targets, ROUTES, alerts={"target": "ops", "group_window": "1s"})
    relay = await start_relay(config, background=False, clock=FakeClock())
    body = b'{"name": "Anna", "phone": "+7 999 123-45-67"}'
    event_id = await post_accepted(http, relay.ingress_url + "/hooks/leads", body)
    await relay.stop()
    killed_while_reading(tmp_path / "relay.db", event_id, event_id)

    relay = await start_relay(config, background=False, clock=FakeClock())
    await relay.indexer.catch_up()  # the next start: it looks back first
    detail = await relay.store.get_event(event_id)
    assert detail is not None
    assert detail.event.flagged is not None
    assert "left out of the search index" in detail.event.flagged
    assert [e.id for e in await relay.store.flagged_events(10)] == [event_id]
    assert (await relay.store.gauges()).flagged == 1
    assert await relay.store.interrupted_indexing() is None
    # Never read again: the index goes on after it, and its deliveries as before.
    later = await post_accepted(http, relay.ingress_url + "/hooks/leads", body)
    await relay.indexer.catch_up()
    found = await relay.store.list_events(EventQuery(search=parse_search("+7 999 123-45-67")))
    assert [e.id for e in found] == [later]
    await relay.scheduler.drain()
    assert {
        d.status for e in await relay.store.list_events(EventQuery()) for d in e.deliveries
    } == {Status.DELIVERED}
    # Alerted through relay's own alert target.
    assert await relay.alerter.flush() is not None
    await relay.scheduler.drain()
    [alert] = [json.loads(r.body) for r in ops.requests]
    assert f"event {event_id}" in json.dumps(alert)


async def test_after_a_crash_amid_a_batch_the_next_start_reads_it_one_at_a_time(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    http: aiohttp.ClientSession,
) -> None:
    # Relay killed amid a batch of three: nothing is flagged (any of the three
    # may be innocent); they are read one at a time, each said first, so a
    # second stop names the one alone.
    _crm, crm_url = await start_sink([200])
    config = make_config({"crm": {"type": "http", "url": crm_url}}, ROUTES)
    relay = await start_relay(config, background=False, clock=FakeClock())
    ids = [
        await post_accepted(http, relay.ingress_url + "/hooks/leads", b'{"n": %d}' % n)
        for n in range(4)
    ]
    await relay.stop()
    killed_while_reading(tmp_path / "relay.db", ids[0], ids[2])

    relay = await start_relay(config, background=False, clock=FakeClock())
    written: list[int | None] = []
    begins = relay.store.indexing_begins

    async def said(through: int | None) -> None:
        written.append(through)
        await begins(through)

    relay.store.indexing_begins = said  # type: ignore[method-assign]
    assert await relay.indexer.catch_up() == 4
    assert written == [ids[0], ids[1], ids[2], ids[3]]  # one at a time, then as usual
    assert await relay.store.flagged_events(10) == []
    assert (await relay.store.search_progress()).indexed_through == ids[3]


async def test_a_stopped_relay_leaves_nothing_to_look_back_at(tmp_path: Path) -> None:
    # `relay serve` stopped by SIGTERM (its indexer at work or not): the next start flags nothing.
    leads = [{"n": n, "pad": "x" * 4000} for n in range(200)]
    config = write_config(
        tmp_path / "relay.toml",
        {
            "server": {"listen": "127.0.0.1:0"},
            "storage": {"path": str(tmp_path / "relay.db")},
            "targets": {"crm": {"type": "file", "path": str(tmp_path / "leads.jsonl")}},
            "routes": ROUTES,
        },
    )
    relay = RelayProcess(config, tmp_path / "relay.log").start()
    try:
        async with aiohttp.ClientSession() as http:
            for lead in leads:
                await post_accepted(http, f"{relay.url}/hooks/leads", json.dumps(lead).encode())
    finally:
        assert await relay.astop() == 0
    with sqlite3.connect(tmp_path / "relay.db") as db:
        [(working,)] = db.execute("SELECT working_through FROM search_progress")
    assert working is None
    stored = await arelay_json("events", "--limit", "1000", "--config", str(config))
    assert len(stored) == 200
