"""Store contract, the Maintenance and Health roles: purge, reclaim_space, release_memory,
backup, write_stats; heartbeat, file_problem; and the lifecycle (open, close,
what a reopened store still holds). Runs over every backend
(tests/store_backends.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay.store import (
    AttemptRecord,
    Dead,
    Delivered,
    EventQuery,
    NewDelivery,
    SearchDocument,
    Status,
    Store,
    StoreError,
    TextSearch,
)

from helpers import record
from samples import T0, TWO, event
from store_backends import Harness

DAY = 86400.0
OK = AttemptRecord(1, T0, 0.01, "success", 200)


async def _finish(store: Store, target: str, now: float) -> None:
    while claims := await store.claim_due(now, now + 60, {target: 100}):
        for claim in claims:
            await record(store, claim, OK, Delivered(), now)


async def test_purge_removes_only_finished_events_older_than_their_cutoff(store: Store) -> None:
    done = await store.accept_event(event("done", at=T0), [NewDelivery("crm")], T0)
    skipped = await store.accept_event(
        event("skipped", at=T0), [NewDelivery("crm", Status.SKIPPED)], T0
    )
    await _finish(store, "crm", T0)
    pending = await store.accept_event(event("pending", at=T0), [NewDelivery("audit")], T0)
    dead = await store.accept_event(
        event("dead", at=T0), [NewDelivery("crm", Status.DEAD, "x")], T0
    )
    half = await store.accept_event(
        event("half", at=T0), [NewDelivery("crm"), NewDelivery("mail")], T0
    )
    await _finish(store, "crm", T0)  # half: crm delivered, mail still pending
    recent = await store.accept_event(event("recent", at=T0 + 2 * DAY), [NewDelivery("crm")], T0)
    await _finish(store, "crm", T0 + 2 * DAY)

    cutoff = T0 + DAY
    assert await store.purge({}, cutoff, limit=0, dry_run=True) == 2
    assert len(await store.list_events(EventQuery())) == 6  # a dry run removes nothing
    assert await store.purge({}, cutoff, limit=1, dry_run=False) == 1  # at most `limit`
    assert await store.purge({}, cutoff, limit=100, dry_run=False) == 1
    assert await store.purge({}, cutoff, limit=100, dry_run=False) == 0
    assert await store.get_event(done.event_id) is None
    assert await store.get_event(skipped.event_id) is None
    # Pending and dead are never purged, however old; nor is an event half done.
    for kept in (pending, dead, half, recent):
        assert await store.get_event(kept.event_id) is not None
    stats = await store.stats()
    assert stats.counts_by_target["crm"][Status.DELIVERED] == 2  # half's and recent's


async def test_purge_cutoffs_per_route(store: Store) -> None:
    await store.accept_event(event("o", route="orders", at=T0), [NewDelivery("crm")], T0)
    await store.accept_event(event("l", route="leads", at=T0), [NewDelivery("crm")], T0)
    await _finish(store, "crm", T0)
    # leads keeps events longer: its cutoff is earlier than the default.
    cutoffs = {"leads": T0 - DAY}
    assert await store.purge(cutoffs, T0 + DAY, limit=0, dry_run=True) == 1
    assert await store.purge(cutoffs, T0 + DAY, limit=10, dry_run=False) == 1
    assert [e.route for e in await store.list_events(EventQuery())] == ["leads"]


async def test_a_purged_event_takes_its_attempts_log_and_search_entry_along(store: Store) -> None:
    accepted = await store.accept_event(event("k", at=T0), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, AttemptRecord(1, T0, 0.1, "fail", 400, "x"), Dead("x"), T0)
    await store.retry_now(claim.id, T0 + 1)
    [claim] = await store.claim_due(T0 + 1, T0 + 61, {"crm": 1})
    await record(store, claim, AttemptRecord(2, T0 + 1, 0.1, "success", 200), Delivered(), T0 + 1)
    await store.index_events([SearchDocument(accepted.event_id, "needle", "")], accepted.event_id)
    search = EventQuery(search=TextSearch(words=("needle",)))
    assert len(await store.list_events(search)) == 1
    assert await store.purge({}, T0 + DAY, limit=10, dry_run=False) == 1
    assert await store.get_delivery(claim.id) is None
    assert await store.list_events(search) == []
    assert [h.attempts for h in await store.activity(T0, T0 + 60)] == [0]
    # An id is never given twice, even after the newest events were purged.
    again = await store.accept_event(event("k2", at=T0 + 2), [NewDelivery("crm")], T0 + 2)
    assert again.event_id > accepted.event_id
    # The indexer never brings a purged event back.
    await store.index_events([SearchDocument(accepted.event_id, "needle", "")], accepted.event_id)
    assert await store.list_events(search) == []


async def test_reclaim_space_ends(store: Store) -> None:
    for i in range(200):
        await store.accept_event(event(f"k{i}", body=b"x" * 4000, at=T0), [NewDelivery("crm")], T0)
    await _finish(store, "crm", T0)
    assert await store.purge({}, T0 + DAY, limit=1000, dry_run=False) == 200
    steps = 0
    while await store.reclaim_space():
        steps += 1
        assert steps < 100
    assert await store.reclaim_space() == 0


async def test_released_memory_costs_nothing_stored(store: Store) -> None:
    """What release_memory gives back is only cached: what was stored, and
    every verb after it, are as before (tests/store/test_memory_release.py
    measures what SQLite gives back)."""
    first = await store.accept_event(event("a", body=b'{"n": 1}'), TWO, T0)
    await store.release_memory()
    await store.release_memory()  # twice in a row: nothing left to give, no error
    detail = await store.get_event(first.event_id)
    assert detail is not None
    assert detail.payload.body == b'{"n": 1}'
    assert (await store.accept_event(event("a", body=b'{"n": 1}'), TWO, T0)).duplicate
    assert not (await store.accept_event(event("b"), TWO, T0)).duplicate


async def test_backup_is_a_complete_copy(backend: Harness, tmp_path: Path) -> None:
    store = await backend.open()
    for i in range(3):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    destination = tmp_path / "copy" / "relay-backup.db"
    destination.parent.mkdir()
    if backend.kind == "postgresql":
        # A server's data is copied by the server's tools: the refusal says
        # which, and leaves nothing behind that looks like a copy.
        with pytest.raises(StoreError, match="pg_dump"):
            await store.backup(destination)
        assert not list(destination.parent.iterdir())
        return
    assert await store.backup(destination) == 3
    assert destination.exists()
    assert destination.stat().st_mode & 0o077 == 0  # holds people's data: ours alone
    assert not list(destination.parent.glob("*.partial"))


async def test_write_stats_count_the_writes(store: Store) -> None:
    commits, writes = store.write_stats
    for i in range(5):
        await store.accept_event(event(f"k{i}"), [NewDelivery("crm")], T0)
    after_commits, after_writes = store.write_stats
    assert after_writes - writes == 5
    assert 1 <= after_commits - commits <= 5


async def test_concurrent_accepts_share_commits(store: Store) -> None:
    before = store.write_stats
    await asyncio.gather(*(store.accept_event(event(f"k{i}"), TWO, T0) for i in range(200)))
    batches, jobs = (a - b for a, b in zip(store.write_stats, before, strict=True))
    assert jobs == 200
    assert batches < 50  # many requests per fsync, not one each


async def test_a_healthy_store_proves_it_can_write(store: Store) -> None:
    assert store.file_problem() is None
    await store.heartbeat(T0)
    await store.heartbeat(T0 + 1)


async def test_a_reopened_store_holds_everything(backend: Harness) -> None:
    store = await backend.open()
    accepted = await store.accept_event(event("k"), [NewDelivery("crm")], T0)
    [claim] = await store.claim_due(T0, T0 + 60, {"crm": 1})
    await record(store, claim, AttemptRecord(1, T0, 0.1, "retry", 503, "x"), Dead("x"), T0)
    await store.set_paused("crm", True, T0)
    before = await store.get_event(accepted.event_id)
    store = await backend.restart(store)
    assert await store.get_event(accepted.event_id) == before
    # The idempotency key survives a restart: a re-send is still a duplicate.
    again = await store.accept_event(event("k"), [NewDelivery("crm")], T0 + 1)
    assert (again.duplicate, again.event_id) == (True, accepted.event_id)
    assert await store.paused_targets() == {"crm"}
