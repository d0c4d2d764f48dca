"""What only the SQLite backend promises: WAL and its partial indexes, a
private file, group commit, a locked file failing fast, rows older than a
migration. The contract every backend keeps is in test_contract.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.store import NewDelivery, SqliteStore, StoreUnavailable
from relay.store.migrations import MIGRATIONS

from samples import T0, TWO, event


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "relay.db", busy_timeout=0.2)
    await store.open()
    yield store
    await store.close()


async def test_rows_stored_before_digests_are_compared_by_their_body(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    store = SqliteStore(path)
    await store.open()
    first = await store.accept_event(event("k", body=b'{"x": 1}'), TWO, T0)
    await store.close()
    with sqlite3.connect(path) as db:  # as a row written by relay before migration 6
        db.execute("UPDATE events SET digest = NULL")
    store = SqliteStore(path)
    await store.open()
    try:
        again = await store.accept_event(event("k", body=b'{"x":1}'), TWO, T0)
        other = await store.accept_event(event("k", body=b'{"x": 2}'), TWO, T0)
    finally:
        await store.close()
    assert again.duplicate
    assert again.event_id == first.event_id
    assert other.conflict_of == first.event_id


async def test_a_locked_database_fails_the_write_instead_of_waiting(
    store: SqliteStore, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "relay.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.accept_event(event("k"), TWO, T0)
    finally:
        other.execute("ROLLBACK")
        other.close()
    # And it recovers by itself once the lock is gone.
    assert not (await store.accept_event(event("k"), TWO, T0)).duplicate


async def test_wal_mode_and_partial_due_index(store: SqliteStore, tmp_path: Path) -> None:
    await store.accept_event(event(), TWO, T0)
    assert (tmp_path / "relay.db-wal").exists()
    db = sqlite3.connect(tmp_path / "relay.db")
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        index_sql = db.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'deliveries_due'"
        ).fetchone()[0]
        assert "WHERE status = 'pending'" in index_sql
        plan = " ".join(
            str(row[3])
            for row in db.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM deliveries WHERE status = 'pending'"
                " AND target = 'crm' AND next_attempt_at <= 1 ORDER BY next_attempt_at LIMIT 5"
            )
        )
        assert "deliveries_due" in plan
        versions = [row[0] for row in db.execute("SELECT version FROM schema_migrations")]
        assert versions == [version for version, _, _ in MIGRATIONS]
    finally:
        db.close()


async def test_database_file_is_private(store: SqliteStore, tmp_path: Path) -> None:
    assert (tmp_path / "relay.db").stat().st_mode & 0o077 == 0


async def test_under_the_serve_lock_every_orphaned_lease_comes_back_at_once(
    tmp_path: Path,
) -> None:
    """One serve per file (the lock): whatever is in flight at start was
    orphaned by a crash, however long its lease still runs."""
    first = SqliteStore(tmp_path / "relay.db")
    await first.open()
    await first.accept_event(event(), TWO, T0)
    claimed = await first.claim_due(T0, T0 + 3600, {"crm": 1, "audit": 1})
    await first.close()
    second = SqliteStore(tmp_path / "relay.db")
    await second.open()
    try:
        assert await second.recover_orphans(T0 + 1) == 2
        again = await second.claim_due(T0 + 1, T0 + 61, {"crm": 1, "audit": 1})
        assert sorted(c.id for c in again) == sorted(c.id for c in claimed)
    finally:
        await second.close()


async def test_a_webhook_behind_an_alert_in_one_batch_is_refused_from_a_deleted_file(
    store: SqliteStore, tmp_path: Path
) -> None:
    # The file check (a sender's guard) was taken from the first job of a run
    # of accepts only: an alert (from_sender=False, no guard) first in a batch
    # let the webhooks after it be answered 200 into a deleted file, gone at
    # the next start. The watch raises exactly that alert when the file goes.
    (tmp_path / "relay.db").unlink()
    alert = store.accept_event(event("alert"), [NewDelivery("ops")], T0, from_sender=False)
    webhook = store.accept_event(event("w"), [NewDelivery("crm")], T0)  # same batch
    await asyncio.wait_for(asyncio.wait([alert, webhook]), 5)
    assert isinstance(webhook.exception(), StoreUnavailable)
    assert "deleted" in str(webhook.exception())


async def test_an_alert_and_a_claim_behind_a_refused_webhook_are_still_written(
    store: SqliteStore, tmp_path: Path
) -> None:
    # The refused webhook's check failed its whole batch: the alert saying
    # the file was deleted, and the scheduler's claims and attempts ("the open
    # file still delivers"), were lost whenever a webhook came first in their
    # batch, which under load (and after a linger they cut short) is always.
    await store.accept_event(event("before"), [NewDelivery("crm")], T0)
    (tmp_path / "relay.db").unlink()
    # The claim's task first, so that its job joins the same batch, last.
    claim = asyncio.ensure_future(store.claim_due(T0 + 1, T0 + 60, {"crm": 10}))
    webhook = store.accept_event(event("w"), [NewDelivery("crm")], T0)
    alert = store.accept_event(event("alert"), [NewDelivery("ops")], T0, from_sender=False)
    batches = store.write_stats[0]
    await asyncio.wait_for(asyncio.wait([webhook, alert, claim]), 5)
    assert isinstance(webhook.exception(), StoreUnavailable)
    assert alert.exception() is None
    assert claim.exception() is None
    assert len(claim.result()) == 1
    assert store.write_stats[0] == batches + 1  # one batch: the three shared it


async def wal_pages_after_commits(tmp_path: Path, commits: int, senders: int) -> int:
    """The WAL file's high-water mark, in pages, after `commits` group commits
    of `senders` webhooks each (~1 KiB bodies)."""
    store = SqliteStore(tmp_path / "relay.db", synchronous="normal")
    await store.open()
    body = b'{"note": "' + b"x" * 1000 + b'"}'
    try:
        for commit in range(commits):
            accepted = await asyncio.gather(
                *(
                    store.accept_event(event(f"k{commit}-{i}", body=body), TWO, T0)
                    for i in range(senders)
                )
            )
            assert not any(a.duplicate for a in accepted)
        return (tmp_path / "relay.db-wal").stat().st_size // 4096
    finally:
        await store.close()


async def test_commits_of_many_senders_checkpoint_in_short_steps(tmp_path: Path) -> None:
    # ~2,000 WAL frames either way. Under load each checkpoint holds up every
    # sender, so they come every 250 pages; a lone sender's every 1,000.
    busy = await wal_pages_after_commits(tmp_path / "busy", commits=100, senders=20)
    lone = await wal_pages_after_commits(tmp_path / "lone", commits=600, senders=1)
    assert busy < 400
    assert lone > 900
