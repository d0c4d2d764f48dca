"""What a receiver that de-duplicates on `Idempotency-Key` does with what
relay sends: every distinct delivery processed once, a repeated one (a retry,
a restored backup's copy) recognised, none refused for reusing a key.

The receivers are written from their documentation (tests/receivers.py).
Before each delivery had an identity of its own the key was the sender's,
else the event id: a second database, a second route with the same sender
key, and a key conflict all sent a key a receiver had already processed, and
it dropped them while relay said "delivered"; a Cyrillic key made every
delivery dead ("cannot be sent").
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from relay.app import Relay
from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory
from receivers import IetfReceiver, Remembering, app

Receivers = tuple[Remembering, IetfReceiver, str]


@pytest.fixture
async def receivers(aiohttp_server: AiohttpServer) -> Receivers:
    remembering, ietf = Remembering(), IetfReceiver()
    server = await aiohttp_server(app(crm=remembering, ietf=ietf))
    return remembering, ietf, str(server.make_url(""))


def targets(base: str) -> dict[str, Any]:
    return {
        "crm": {"type": "http", "url": f"{base}/crm"},
        # A second target on the same receiver: the same event, another delivery.
        "crm_copy": {"type": "http", "url": f"{base}/crm"},
        "ietf": {"type": "http", "url": f"{base}/ietf", "idempotency_key_form": "string"},
    }


ROUTES = {
    "shop1": {"path": "/hooks/shop1", "targets": ["crm", "crm_copy", "ietf"]},
    # Another shop whose orders are numbered like the first one's.
    "shop2": {"path": "/hooks/shop2", "targets": ["crm", "ietf"]},
    # A 1C export keyed by its order number, which is Cyrillic.
    "onec": {
        "path": "/hooks/1c",
        "idempotency_key": "{{ json.number }}",
        "targets": ["crm", "ietf"],
    },
}


async def post(
    http: aiohttp.ClientSession, relay: Relay, path: str, body: dict[str, Any], key: str = ""
) -> int:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key  # aiohttp writes UTF-8, as a PHP or 1C sender does
    async with http.post(relay.ingress_url + path, data=json.dumps(body), headers=headers) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["id"])


def identities(database: Path) -> Iterator[tuple[str, str, int]]:
    """(identity, target, event id) of every delivery stored in `database`,
    read from the file: what should arrive once at the receiver."""
    with sqlite3.connect(database) as db:
        for delivery_id, tag, target, event_id in db.execute(
            "SELECT id, message_tag, target, event_id FROM deliveries"
        ):
            yield f"msg_relay_{delivery_id}_{tag}", target, event_id


async def test_every_distinct_delivery_is_processed_once_across_databases_routes_and_conflicts(
    tmp_path: Path,
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    receivers: Receivers,
    http: aiohttp.ClientSession,
) -> None:
    remembering, ietf, base = receivers
    first_db, second_db = tmp_path / "first.db", tmp_path / "second.db"
    first_config = make_config(targets(base), ROUTES, storage={"path": str(first_db)})
    first = await start_relay(first_config, background=False, clock=FakeClock())
    # The IETF receiver's target is paused: its deliveries wait, and are in the backup below.
    await first.console.set_paused("ietf", True, by="test")

    await post(http, first, "/hooks/shop1", {"order": 1}, "order-1001")
    await post(http, first, "/hooks/shop2", {"order": 2}, "order-1001")  # the same sender key
    conflict = await post(http, first, "/hooks/shop1", {"order": 3}, "order-1001")  # new payload
    cyrillic = await post(http, first, "/hooks/shop1", {"order": 4}, "заказ-1")
    await post(http, first, "/hooks/1c", {"number": "ЗК-000123"})
    dropped = await post(http, first, "/hooks/shop1", {"order": 5}, "order-2000")
    # The receiver processes this one and closes the connection without answering.
    [lost_answer] = [k for k, t, e in identities(first_db) if t == "crm" and e == dropped]
    remembering.drop_after = {lost_answer}
    await first.scheduler.drain()
    stored = {e.id: e for e in await first.store.list_events(EventQuery())}
    assert stored[conflict].conflict_of is not None
    assert stored[cyrillic].idempotency_key == "заказ-1"

    # A restart, then the database restored from a backup into a second relay
    # (a reinstall, a second VPS): both number their next deliveries alike.
    await first.stop()
    shutil.copy(first_db, second_db)
    first = await start_relay(first_config, background=False, clock=FakeClock())
    second = await start_relay(
        make_config(targets(base), ROUTES, storage={"path": str(second_db)}),
        background=False,
        clock=FakeClock(),
    )
    for relay in (first, second):
        await relay.console.set_paused("ietf", False, by="test")
    in_first = await post(http, first, "/hooks/shop1", {"order": 6}, "order-3000")
    in_second = await post(http, second, "/hooks/shop1", {"order": 7}, "order-3000")
    assert in_first == in_second
    await first.scheduler.drain()
    await second.scheduler.drain()

    for relay in (first, second):
        for event in await relay.store.list_events(EventQuery()):
            assert {d.status for d in event.deliveries} == {Status.DELIVERED}, event
    # Both databases' deliveries; the backup's copies of the first's count once.
    wanted = {key: target for db in (first_db, second_db) for key, target, _event in identities(db)}
    processed = Counter(item.key for item in remembering.processed)
    assert max(processed.values()) == 1
    assert set(processed) == {key for key, target in wanted.items() if target != "ietf"}
    # The one whose answer was lost came again under its key, and was recognised.
    assert [item.key for item in remembering.acknowledged_again] == [lost_answer]
    # The IETF receiver: each delivery once (the backup's copy of a waiting
    # one is the same request again), nothing refused for its key.
    assert ietf.refused == []
    assert Counter(item.key for item in ietf.processed) == Counter(
        {key: 1 for key, target in wanted.items() if target == "ietf"}
    )
    # Every key relay sends is ASCII by construction: none made a delivery dead.
    assert all(item.key.isascii() for item in remembering.processed)


@pytest.mark.postgres
async def test_two_postgres_databases_of_two_instances_each_never_share_a_key(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    receivers: Receivers,
    http: aiohttp.ClientSession,
    pg_url: str,
    other_pg_url: str,
) -> None:
    # Two shops' clusters, each two relays on one database, all sending to one
    # receiver with the same sender keys: every database numbers from 1.
    remembering, ietf, base = receivers
    instances = []
    for url in (pg_url, other_pg_url):
        config = make_config(targets(base), ROUTES, storage={"url": url})
        for _ in range(2):
            instances.append(await start_relay(config, background=False, clock=FakeClock()))
    for number, relay in enumerate(instances):
        await post(http, relay, "/hooks/shop1", {"order": number}, f"order-{number % 2}")
        await post(http, relay, "/hooks/1c", {"number": f"ЗК-00012{number % 2}"})
    for relay in instances:
        await relay.scheduler.drain()

    deliveries = [
        d
        for relay in instances[::2]  # one instance of each database sees all of its rows
        for event in await relay.store.list_events(EventQuery())
        for d in event.deliveries
    ]
    assert len(deliveries) == 4 * (3 + 2)
    assert {d.status for d in deliveries} == {Status.DELIVERED}
    processed = Counter(item.key for item in remembering.processed)
    assert len(processed) == 4 * (2 + 1)
    assert max(processed.values()) == 1
    assert ietf.refused == []
    assert len(ietf.processed) == 4 * 2
