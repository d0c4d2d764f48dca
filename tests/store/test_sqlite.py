"""What only the SQLite backend promises: WAL and its partial indexes, a
private file, group commit, a locked file failing fast, rows older than a
migration. The contract every backend keeps is in test_contract.py."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.store import (
    EventQuery,
    NewDelivery,
    SearchDocument,
    SearchTooSlow,
    SqliteStore,
    Store,
    StoreUnavailable,
    TextSearch,
)
from relay.store.migrations import MIGRATIONS
from relay.store.sqlite.checkpointer import BACKSTOP_PAGES

from helpers import eventually
from samples import T0, TWO, event, identities_survive_their_migration


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
        assert (await second.recover_orphans(T0 + 1)).taken_back == 2
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


async def wal_pages_after_commits(tmp_path: Path, commits: int) -> int:
    """The WAL file's high-water mark, in pages, after `commits` commits of one
    ~1 KiB webhook each, as a lone sender's."""
    store = SqliteStore(tmp_path / "relay.db", synchronous="normal")
    await store.open()
    body = b'{"note": "' + b"x" * 1000 + b'"}'
    try:
        for commit in range(commits):
            accepted = await store.accept_event(event(f"k{commit}", body=body), TWO, T0)
            assert not accepted.duplicate
        return (tmp_path / "relay.db-wal").stat().st_size // 4096
    finally:
        await store.close()


async def test_the_wal_stays_bounded_while_commits_keep_coming(tmp_path: Path) -> None:
    # Commits a checkpoint beside the writer cannot keep up with (no fsync
    # between them here) leave it frames to copy each time, and SQLite starts
    # the WAL over only after a checkpoint that copied all of it: the writer's
    # own, at BACKSTOP_PAGES. Without one the WAL would grow to ~16,800 pages.
    # Past it by the frames committed while the thread's checkpoint (its
    # fsync of the database file) is under way: a commit whose checkpoint
    # finds it leaves it to the next (seen: 4,267 pages).
    pages = await wal_pages_after_commits(tmp_path, commits=2000)
    assert pages < 2 * BACKSTOP_PAGES


async def test_the_database_file_takes_the_commits_soon_beside_the_writer(
    tmp_path: Path,
) -> None:
    # A few commits, far below any wal_autocheckpoint: SQLite alone would
    # leave them in the WAL until one commit grew it past the threshold and
    # checkpointed inside itself, holding up that commit's senders
    # (relay.store.sqlite.checkpointer). Here the file has them soon after, though
    # no commit checkpointed.
    path = tmp_path / "relay.db"
    store = SqliteStore(path)
    await store.open()
    for number in range(20):
        await store.accept_event(event(f"k{number}"), TWO, T0)

    async def in_the_file_itself() -> bool:
        copy = tmp_path / "file-alone.db"  # the database file without its WAL
        copy.write_bytes(path.read_bytes())
        database = sqlite3.connect(copy)
        try:
            count: int = database.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        except sqlite3.DatabaseError:  # copied amid a checkpoint: look again
            return False
        finally:
            database.close()
            copy.unlink()
        return count == 20

    await eventually(in_the_file_itself, timeout=5.0)
    await store.close()
    # The checkpointer's connection closed before the writer's, the last:
    # SQLite then copied the rest and removed the WAL.
    assert not (tmp_path / "relay.db-wal").exists()


async def test_a_search_past_its_budget_is_stopped_and_stats_never_wait_for_it(
    store: SqliteStore,
) -> None:
    # Before: one 7,000-digit search of 200,000 events held the reader that
    # the stats share for 17-26 s. Searches have a reader of their own and a
    # budget (SEARCH_SECONDS; here tiny, so a real search of a real index
    # runs past it).
    documents = []
    for n in range(3000):
        accepted = await store.accept_event(event(key=f"k{n}"), [NewDelivery("a")], T0)
        documents.append(SearchDocument(accepted.event_id, f"lead {n} petrov ivan", f"7999{n:07d}"))
    await store.index_events(documents, documents[-1].event_id)
    found = await store.list_events(EventQuery(search=TextSearch(digits="79990000123"), limit=5))
    assert [e.id for e in found] == [documents[123].event_id]
    store.search_seconds = 0.0
    # Every event matches, none is on this route: the search walks them all.
    walk = EventQuery(search=TextSearch(words=("petrov",)), route="elsewhere")
    slow = asyncio.create_task(store.list_events(walk))
    stats = await store.stats()  # not behind the search
    assert sum(stats.counts_by_target["a"].values()) == 3000
    with pytest.raises(SearchTooSlow, match="narrow it"):
        await slow
    store.search_seconds = 60.0
    assert len(await store.list_events(EventQuery(search=TextSearch(words=("petrov",))))) == 50


async def test_deliveries_stored_before_identities_keep_the_key_they_were_sent_with(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.db"

    async def roll_back(store: Store, untagged: list[int]) -> Store:
        # Migration 13 undone: the next open applies it (every migration not
        # recorded is, in order).
        await store.close()
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("ALTER TABLE deliveries DROP COLUMN event_keyed")
            db.execute("DELETE FROM schema_migrations WHERE version = 13")
            db.executemany(
                "UPDATE deliveries SET message_tag = NULL WHERE id = ?", [(i,) for i in untagged]
            )
        again = SqliteStore(path)
        await again.open()
        return again

    store = SqliteStore(path)
    await store.open()
    store = await identities_survive_their_migration(store, roll_back)
    await store.close()
