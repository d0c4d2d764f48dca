"""Retention: finished events go after their time; pending and dead ones never do."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiohttp

from relay.app import Relay
from relay.background import retention
from relay.core.clock import FakeClock
from relay.store import EventQuery, Status

from conftest import ConfigFactory, RelayFactory
from helpers import relay_cli

DAY = 86400.0


async def post(
    relay: Relay, http: aiohttp.ClientSession, path: str, key: str, size: int = 10
) -> tuple[str, str]:
    async with http.post(
        relay.ingress_url + path, data=b"x" * size, headers={"Idempotency-Key": key}
    ) as response:
        answer = await response.json()
        return answer["status"], answer["id"]


async def test_purge_keeps_pending_dead_and_young_events(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    config = make_config(
        {
            "ok": {"type": "file", "path": "ok.jsonl"},
            "down": {"type": "http", "url": "http://127.0.0.1:9/x"},
        },
        {
            "done": {"path": "/done", "targets": ["ok"]},
            "stuck": {"path": "/stuck", "targets": ["down"]},
            "payments": {"path": "/pay", "targets": ["ok"], "dedup_window": "60d"},
        },
        storage={"retention": "30d"},
        retry={"retries": 1},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    await post(relay, http, "/done", "old-delivered")
    await post(relay, http, "/pay", "old-payment")
    await post(relay, http, "/stuck", "old-dead")
    await relay.scheduler.drain()
    await relay.store.set_paused("down", True, clock.now())
    await post(relay, http, "/stuck", "old-pending")
    clock.advance(20 * DAY)
    await post(relay, http, "/done", "young-delivered")
    await relay.scheduler.drain()
    clock.advance(11 * DAY)  # old ones are 31 days old, young ones 11

    assert (
        await retention.purge(
            relay.store, 30 * DAY, retention.dedup_windows(config), clock.now(), dry_run=True
        )
        == 1
    )
    assert (
        await retention.purge(
            relay.store, config.storage.retention, retention.dedup_windows(config), clock.now()
        )
        == 1
    )
    keys = {e.idempotency_key: e for e in await relay.store.list_events(EventQuery())}
    assert set(keys) == {"old-payment", "old-dead", "old-pending", "young-delivered"}
    assert keys["old-dead"].status is Status.DEAD
    assert keys["old-pending"].status is Status.PENDING

    # A key lives as long as its event: the purged one may come again, the payment may not.
    assert (await post(relay, http, "/done", "old-delivered"))[0] == "queued"
    assert (await post(relay, http, "/pay", "old-payment"))[0] == "duplicate"
    clock.advance(30 * DAY)
    await relay.scheduler.drain()
    await retention.purge(
        relay.store, config.storage.retention, retention.dedup_windows(config), clock.now()
    )
    assert (await post(relay, http, "/pay", "old-payment"))[0] == "queued"


async def test_purged_space_is_given_back(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
) -> None:
    config = make_config(
        {"ok": {"type": "file", "path": "ok.jsonl"}},
        {"done": {"path": "/done", "targets": ["ok"]}},
        storage={"retention": "1d"},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    for i in range(200):
        await post(relay, http, "/done", f"k{i}", size=20_000)
    await relay.scheduler.drain()
    db = sqlite3.connect(config.storage.path)
    full = db.execute("PRAGMA page_count").fetchone()[0]
    clock.advance(2 * DAY)
    assert (
        await retention.purge(
            relay.store, config.storage.retention, retention.dedup_windows(config), clock.now()
        )
        == 200
    )
    await relay.store.reclaim_space()
    assert db.execute("PRAGMA page_count").fetchone()[0] < full / 4
    db.close()


async def test_cli_purge(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    from helpers import write_config

    path = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": "relay.db", "retention": "1ms"},
            "targets": {"ok": {"type": "file", "path": "ok.jsonl"}},
            "routes": {"done": {"path": "/done", "targets": ["ok"]}},
        },
    )
    from relay.loader import load_config

    relay = await start_relay(load_config(path, {}), background=False)
    await post(relay, http, "/done", "a")
    await relay.scheduler.drain()
    await relay.stop()
    dry = relay_cli("purge", "--dry-run", "--config", str(path))
    assert "would remove 1 finished events" in dry.stdout
    assert "removed 1 finished events" in relay_cli("purge", "--config", str(path)).stdout
    assert "would remove 0" in relay_cli("purge", "--dry-run", "--config", str(path)).stdout


async def test_ids_are_never_given_twice_after_everything_is_purged(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # A keyless event goes out with Idempotency-Key = its event id: an id given
    # again after a purge would look like a resend to a receiver that remembers.
    config = make_config(
        {"ok": {"type": "file", "path": "ok.jsonl"}},
        {"done": {"path": "/done", "targets": ["ok"]}},
        storage={"retention": "30d"},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    first = [await post(relay, http, "/done", f"k{i}") for i in range(3)]
    await relay.scheduler.drain()
    before = await relay.store.list_events(EventQuery())
    last_delivery = max(d.id for e in before for d in e.deliveries)
    clock.advance(31 * DAY)
    removed = await retention.purge(
        relay.store, config.storage.retention, retention.dedup_windows(config), clock.now()
    )
    assert removed == 3
    assert await relay.store.list_events(EventQuery()) == []

    status, new_id = await post(relay, http, "/done", "after-purge")
    assert status == "queued"
    assert int(new_id) > max(int(event_id) for _, event_id in first)
    (after,) = await relay.store.list_events(EventQuery())
    assert min(d.id for d in after.deliveries) > last_delivery


async def test_the_retention_pass_counts_what_it_removed_in_metrics(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # relay_purged_events_total was registered and documented, and stayed 0.
    config = make_config(
        {"ok": {"type": "file", "path": "ok.jsonl"}},
        {"done": {"path": "/done", "targets": ["ok"]}},
        storage={"retention": "30d"},
    )
    clock = FakeClock()
    relay = await start_relay(config, background=False, clock=clock)
    for i in range(3):
        await post(relay, http, "/done", f"k{i}")
    await relay.scheduler.drain()
    assert await relay.retention.run_once() == 0
    clock.advance(31 * DAY)
    assert await relay.retention.run_once() == 3
    async with http.get(relay.admin_url + "/metrics") as response:
        text = await response.text()
    assert "relay_purged_events_total 3.0" in text.splitlines()
