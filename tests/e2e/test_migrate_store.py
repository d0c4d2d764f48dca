"""`relay migrate-store`: a SQLite install moved to PostgreSQL keeps every
event, delivery, attempt, history entry and pause, with the same ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.core.payload import Payload
from relay.store import (
    AttemptRecord,
    Dead,
    Delivered,
    EventQuery,
    NewDelivery,
    NewEvent,
    Resend,
    RetryAt,
    SearchDocument,
    Selection,
    SqliteStore,
    Status,
)
from relay.store.backends import lock_path
from relay.store.lock import ProcessLock
from relay.store.postgres import PostgresStore

from helpers import arelay_cli, record, write_config

pytestmark = pytest.mark.postgres

T0 = 1_800_000_000.0


def event(key: str | None, body: bytes, at: float) -> NewEvent:
    return NewEvent(
        route="orders",
        idempotency_key=key,
        received_at=at,
        remote_addr="203.0.113.7",
        payload=Payload(
            method="POST",
            path="/hooks/orders",
            query="a=1",
            headers=[("Content-Type", "application/json"), ("X-Dup", "1"), ("X-Dup", "2")],
            content_type="application/json",
            body=body,
        ),
    )


async def fill(path: Path) -> list[int]:
    """A database with a bit of everything a real one has."""
    store = SqliteStore(path)
    await store.open()
    try:
        ids = []
        for i in range(12):
            deliveries = [NewDelivery("crm"), NewDelivery("mail", order_key=f"o{i % 2}")]
            accepted = await store.accept_event(
                event(f"k{i}", f'{{"n": {i}}}'.encode() + b"\xff", T0 + i), deliveries, T0 + i
            )
            ids.append(accepted.event_id)
        conflict = await store.accept_event(event("k0", b'{"n": "other"}', T0 + 20), [], T0 + 20)
        ids.append(conflict.event_id)
        claimed = await store.claim_due(T0 + 30, T0 + 90, {"crm": 6, "mail": 2})
        for n, delivery in enumerate(claimed):
            if n % 3 == 0:
                await record(
                    store,
                    delivery,
                    AttemptRecord(1, T0 + 30, 0.2, "success", 200),
                    Delivered(),
                    T0 + 31,
                )
            elif n % 3 == 1:
                attempt = AttemptRecord(1, T0 + 30, 0.1, "retry", 503, "HTTP 503", b"busy")
                await record(store, delivery, attempt, RetryAt(T0 + 40), T0 + 31)
            else:
                attempt = AttemptRecord(1, T0 + 30, 0.1, "fail", 400, "HTTP 400", b"no")
                await record(store, delivery, attempt, Dead("HTTP 400"), T0 + 31)
        await store.requeue(Selection(status=Status.DEAD), T0 + 50)
        await store.set_paused("mail", True, T0 + 51)
        copy = await store.resend(
            Resend(
                ids[1],
                (("Content-Type", "application/json"),),
                b'{"n": 1.5}',
                "application/json",
                ("crm",),
                "cli user anna",
            ),
            T0 + 52,
        )
        ids.append(copy)
        await store.index_events([SearchDocument(ids[0], "hello world", "79991234567")], ids[0])
        # The newest event finished and purged: its id must never be given again.
        last = await store.accept_event(event(None, b"{}", T0 - 99999), [], T0 - 99999)
        assert await store.purge({}, T0, limit=10, dry_run=False) >= 1
        assert await store.get_event(last.event_id) is None
        return ids
    finally:
        await store.close()


async def test_a_sqlite_database_moves_with_its_ids_and_history(
    tmp_path: Path, pg_url: str
) -> None:
    database = tmp_path / "relay.db"
    ids = await fill(database)
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(database)},
            "targets": {"crm": {"type": "file", "path": str(tmp_path / "crm.jsonl")}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    result = await arelay_cli("migrate-store", "--config", str(config), "--to", pg_url)
    assert "counts verified" in result.stdout

    sqlite, pg = SqliteStore(database), PostgresStore(pg_url)
    await sqlite.open()
    await pg.open()
    try:
        for event_id in ids:
            assert await pg.get_event(event_id) == await sqlite.get_event(event_id)
        assert await pg.list_events(EventQuery(limit=100)) == await sqlite.list_events(
            EventQuery(limit=100)
        )
        assert await pg.paused_targets() == frozenset({"mail"})
        assert (await pg.stats()).counts_by_target == (await sqlite.stats()).counts_by_target
        assert await pg.search_progress() == await sqlite.search_progress()
        # New ids follow the highest ever given on SQLite, the purged one included.
        newest = await sqlite.search_progress()
        fresh = await pg.accept_event(event("new", b"{}", T0 + 60), [NewDelivery("crm")], T0 + 60)
        assert fresh.event_id > max(ids) + 1
        assert fresh.event_id > newest.newest
        # A re-send of a moved event is still a duplicate of it.
        again = await pg.accept_event(event("k3", b'{"n": 3}\xff', T0 + 61), [], T0 + 61)
        assert (again.duplicate, again.event_id) == (True, ids[3])
        # Each delivery keeps its tag, so its webhook-id: a receiver that saw
        # an attempt before the move recognises the next one.
        moved = await pg.claim_due(T0 + 999, T0 + 1999, {"crm": 100})
        kept = await sqlite.claim_due(T0 + 999, T0 + 1999, {"crm": 100})
        assert kept
        assert all(d.message_tag for d in kept)
        tags = {d.id: d.message_tag for d in moved}
        assert {d.id: d.message_tag for d in kept} == {d.id: tags[d.id] for d in kept}
    finally:
        await sqlite.close()
        await pg.close()

    # Copied once: a second run refuses, and changes nothing.
    refused = await arelay_cli(
        "migrate-store", "--config", str(config), "--to", pg_url, check=False
    )
    assert refused.returncode != 0
    assert "already holds events" in refused.stderr


async def test_it_refuses_while_relay_serve_runs(tmp_path: Path, pg_url: str) -> None:
    database = tmp_path / "relay.db"
    await fill(database)
    config = write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"path": str(database)},
            "targets": {"crm": {"type": "file", "path": str(tmp_path / "crm.jsonl")}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )
    daemon = ProcessLock(lock_path(database))  # what a running relay serve holds
    daemon.acquire()
    try:
        result = await arelay_cli(
            "migrate-store", "--config", str(config), "--to", pg_url, check=False
        )
    finally:
        daemon.release()
    assert result.returncode == 2
    assert "relay serve is running" in result.stderr
    assert "Traceback" not in result.stderr
