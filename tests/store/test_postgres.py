"""What only the PostgreSQL store has to prove: several instances on one
database, and a server that goes away and comes back.

Real clusters (tests/pgcluster.py); each "instance" is a PostgresStore of its
own with its own pool and instance id, as separate `relay serve` processes are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from relay.background.alerts import Alerter
from relay.background.silence import SilenceWatch
from relay.config import AlertsConfig, Config, RetryPolicy
from relay.core.clock import FakeClock
from relay.core.outcome import Outcome
from relay.core.payload import Payload
from relay.core.pgurl import masked_url
from relay.core.records import FRESH_PROBE_GAP
from relay.delivery.scheduler import AttemptReport, Scheduler
from relay.delivery.step import Attempted, Rules, step
from relay.kinds.target import Target
from relay.loader.registry import build_target
from relay.store import (
    AttemptKind,
    AttemptRecord,
    ClaimedDelivery,
    Delivered,
    EventQuery,
    NewDelivery,
    NewEvent,
    Resend,
    RetryAt,
    Selection,
    Status,
    Store,
    StoreError,
    StoreUnavailable,
    Waits,
)
from relay.store.accept import AcceptJob
from relay.store.postgres import PostgresStore
from relay.store.postgres.accept import store_batch
from relay.store.postgres.cluster import TargetLimits
from relay.store.postgres.schema import MIGRATIONS

from conftest import ConfigFactory
from helpers import Hold, record
from helpers import eventually as poll_until
from pgcluster import Cluster, commits_off, create_cluster, remove_cluster, server_bin
from pgcut import CommitCutter
from samples import identities_survive_their_migration

pytestmark = pytest.mark.postgres

T0 = 1_800_000_000.0


def event(key: str | None = None, body: bytes = b'{"a": 1}') -> NewEvent:
    return NewEvent(
        route="orders",
        idempotency_key=key,
        received_at=T0,
        remote_addr="127.0.0.1",
        payload=Payload(
            method="POST",
            path="/hooks/orders",
            query="",
            headers=[("Content-Type", "application/json")],
            content_type="application/json",
            body=body,
        ),
    )


@contextlib.asynccontextmanager
async def through_cutter(
    cluster: Cluster, url: str, folder: Path, **options: Any
) -> AsyncIterator[tuple[CommitCutter, PostgresStore]]:
    """Instance "a" on the database at `url`, its connections through a
    CommitCutter (tests/pgcut.py): open, then closed with the cutter."""
    cutter = CommitCutter(cluster.socket_dir, folder)
    async with cutter.running():
        store = PostgresStore(cutter.url(url), instance_id="a", **options)
        await store.open()
        try:
            yield cutter, store
        finally:
            await store.close()


@pytest.fixture
async def two(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    a = PostgresStore(pg_url, instance_id="a")
    b = PostgresStore(pg_url, instance_id="b")
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


async def test_instances_starting_together_migrate_once(pg_cluster_url_empty: str) -> None:
    stores = [PostgresStore(pg_cluster_url_empty, instance_id=f"i{n}") for n in range(4)]
    await asyncio.gather(*(store.open() for store in stores))
    try:
        connection = await asyncpg.connect(pg_cluster_url_empty)
        try:
            versions = await connection.fetch("SELECT version FROM schema_migrations")
        finally:
            await connection.close()
        assert [row[0] for row in versions] == [version for version, _, _ in MIGRATIONS]
    finally:
        await asyncio.gather(*(store.close() for store in stores))


async def test_two_instances_never_claim_the_same_delivery(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await asyncio.gather(*(a.accept_event(event(), [NewDelivery("crm")], T0) for _ in range(60)))
    claims = await asyncio.gather(
        *(store.claim_due(T0, T0 + 60, {"crm": 7}) for store in (a, b) for _ in range(6))
    )
    ids = [c.id for claim in claims for c in claim]
    assert len(ids) == len(set(ids)) == 60


async def test_the_same_key_through_two_instances_at_once_is_one_event(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    results = await asyncio.gather(
        *(store.accept_event(event("k"), [NewDelivery("crm")], T0) for store in (a, b) * 10)
    )
    assert sum(not r.duplicate for r in results) == 1
    assert len({r.event_id for r in results}) == 1
    # Other content under that key, from both at once: one conflict each, no duplicate answer.
    other = await asyncio.gather(
        a.accept_event(event("k", b'{"a": 2}'), [NewDelivery("crm")], T0),
        b.accept_event(event("k", b'{"a": 3}'), [NewDelivery("crm")], T0),
    )
    assert [r.duplicate for r in other] == [False, False]
    assert {r.conflict_of for r in other} == {results[0].event_id}


async def test_orphans_are_recovered_per_instance_never_another_live_ones(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await a.accept_event(event(), [NewDelivery("crm"), NewDelivery("mail")], T0)
    [held_by_a] = await a.claim_due(T0, T0 + 60, {"crm": 1})
    [held_by_b] = await b.claim_due(T0, T0 + 60, {"mail": 1})
    # b restarting gives back its own lease only: a's attempt is still under way.
    assert (await b.recover_orphans(T0 + 1)).taken_back == 1
    assert await b.claim_due(T0 + 1, T0 + 61, {"crm": 1}) == []
    [again] = await b.claim_due(T0 + 1, T0 + 61, {"mail": 1})
    assert again.id == held_by_b.id
    # a stops without giving its lease back: b takes the delivery over at once.
    await a.close()
    [taken] = await b.claim_due(T0 + 2, T0 + 62, {"crm": 1})
    assert taken.id == held_by_a.id


@pytest.mark.parametrize(("answer", "goes"), [("success", False), ("retry", True)])
async def test_a_copy_made_on_one_instance_waits_for_anothers_attempt(
    two: tuple[PostgresStore, PostgresStore], answer: str, goes: bool
) -> None:
    """a attempts the original; a person's resend goes through b meanwhile.
    Neither instance claims the copy while a's attempt is under way; a's
    record decides: delivered, the copy is skipped; failed, it goes."""
    a, b = two
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    [held] = await a.claim_due(T0, T0 + 60, {"crm": 1})
    copy_id = await b.resend(
        Resend(held.event_id, (), b'{"a": 2}', "application/json", ("crm",), "cli user anna"),
        T0 + 1,
    )
    for store in (a, b):
        assert await store.claim_due(T0 + 2, T0 + 62, {"crm": 4}) == []
        assert await store.next_due(["crm"]) == {"crm": T0 + 60}  # a's lease, not the copy
    then = Delivered() if answer == "success" else RetryAt(T0 + 100)
    await record(a, held, AttemptRecord(1, T0, 0.01, answer, 200, None), then, T0 + 3)
    claims = await b.claim_due(T0 + 4, T0 + 64, {"crm": 4})
    assert [c.event_id for c in claims] == ([copy_id] if goes else [])
    view = await b.get_delivery(held.id)
    assert view is not None
    assert view.status is (Status.SUPERSEDED if goes else Status.DELIVERED)


async def test_a_copy_waiting_for_a_gone_instances_attempt_goes_once_that_lease_is_taken_over(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """a dies with an attempt under way; a person made a corrected copy of its
    event meanwhile. b never sends the original again (it may have gone out,
    and the copy is what the person wants sent): the next claim ends it as
    interrupted, superseded, and the one after takes the copy."""
    a, b = two
    b.set_limits({"crm": TargetLimits(concurrency=4)})
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    [held] = await a.claim_due(T0, T0 + 60, {"crm": 1})
    copy_id = await b.resend(
        Resend(held.event_id, (), b'{"a": 2}', "application/json", ("crm",), "cli user anna"),
        T0 + 1,
    )
    assert await b.claim_due(T0 + 2, T0 + 62, {"crm": 4}) == []  # a's attempt is under way
    await a.close()  # stopped: its lease may be taken at once
    assert await b.claim_due(T0 + 3, T0 + 63, {"crm": 4}) == []  # ended, not taken over
    view = await b.get_delivery(held.id)
    assert view is not None
    assert (view.status, view.attempts) == (Status.SUPERSEDED, 1)
    [copy] = await b.claim_due(T0 + 4, T0 + 64, {"crm": 4})
    assert copy.event_id == copy_id


async def test_a_late_attempt_leaves_the_delivery_to_the_instance_that_took_it_over(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """a is slow, not dead: its lease runs out while its attempt is under way
    (a database away longer than the lease while a retries recording it), b
    takes the delivery over and sends again. a's attempt, recorded late, is
    history; what becomes of the delivery is b's to say."""
    a, b = two
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    [slow] = await a.claim_due(T0, T0 + 60, {"crm": 1})
    await leases_run_out(pg_url, 61)
    [taken] = await b.claim_due(T0 + 61, T0 + 121, {"crm": 1})
    assert taken.id == slow.id
    failed = AttemptRecord(1, T0, 61.0, "retry", 503, "HTTP 503", b"")
    await record(a, slow, failed, RetryAt(T0 + 62), T0 + 61.5)
    await a.release([slow.id], T0 + 61.5)  # a stopping gives back what it thinks it holds
    view = await b.get_delivery(slow.id)
    assert view is not None
    # Still b's; a's attempt counted when b took it over: b's is number 2.
    assert (view.status, view.attempts) == (Status.IN_FLIGHT, 1)
    assert taken.attempts == 1
    assert await a.claim_due(T0 + 63, T0 + 123, {"crm": 1}) == []  # nobody sends it beside b
    await record(b, taken, AttemptRecord(2, T0 + 61, 0.1, "success", 200), Delivered(), T0 + 62)
    view = await b.get_delivery(slow.id)
    assert view is not None
    assert (view.status, view.attempts, view.last_error) == (Status.DELIVERED, 2, None)
    detail = await b.get_event(slow.event_id)
    assert detail is not None
    # Both requests went out, and the history says so, each with its number.
    assert sorted((a.number, a.outcome) for a in detail.attempts[slow.id]) == [
        (1, "retry"),
        (2, "success"),
    ]


async def test_a_clock_minutes_ahead_takes_no_live_instances_lease(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    """Each instance claims by its own clock; b's runs ten minutes ahead of a's
    (a VPS without NTP). a is alive and sending: b neither takes its lease, nor
    counts it out of the cluster's concurrency, nor gives it back as it starts.
    A live instance's lease runs out by the server's clock."""
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=1)})
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    [held] = await a.claim_due(T0, T0 + 70, {"crm": 1})
    ahead = T0 + 600
    assert await b.claim_due(ahead, ahead + 70, {"crm": 1}) == []
    assert (await b.recover_orphans(ahead)).taken_back == 0
    view = await b.get_delivery(held.id)
    assert view is not None
    assert view.status is Status.IN_FLIGHT
    await leases_run_out(pg_url, 71)  # seventy seconds later by the server's clock
    [taken] = await b.claim_due(ahead, ahead + 70, {"crm": 1})
    assert taken.id == held.id


async def test_durability_settings_are_read_from_the_server(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    settings = await two[0].server_settings()
    assert settings["fsync"] == "on"
    assert settings["synchronous_commit"] == "on"


async def test_events_are_committed_synchronously_where_the_database_says_otherwise(
    pg_url: str,
) -> None:
    """A role or database left with synchronous_commit = off (relay check warns
    of it) would have relay answer 200 before the event is on disk: relay's own
    sessions commit synchronously all the same."""
    await commits_off(pg_url)
    store = PostgresStore(pg_url, instance_id="a")
    await store.open()
    try:
        assert (await store.server_settings())["synchronous_commit"] == "on"
        await store.accept_event(event(), [NewDelivery("crm")], T0)
    finally:
        await store.close()


async def test_a_server_that_goes_away_answers_unavailable_and_comes_back() -> None:
    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries not found")
    cluster = create_cluster()  # its own: this test stops it
    store = PostgresStore(cluster.url("postgres"), command_timeout=3, write_queue_timeout=3)
    try:
        await store.open()
        kept = await store.accept_event(event("before"), [NewDelivery("crm")], T0)
        cluster.stop("immediate")
        with pytest.raises(StoreUnavailable):
            await store.accept_event(event("while down"), [NewDelivery("crm")], T0)
        with pytest.raises(StoreUnavailable):
            await store.claim_due(T0, T0 + 60, {"crm": 1})
        # Its connections broken, the next try connects anew, and the error
        # says where it found no server (the driver's names no socket).
        with pytest.raises(StoreUnavailable) as away:
            await store.accept_event(event("still down"), [NewDelivery("crm")], T0)
        assert f"no PostgreSQL server answers at {masked_url(cluster.url('postgres'))}" in str(
            away.value
        )
        assert "FileNotFoundError" in str(away.value)
        cluster.start()
        # No restart of relay: the pool connects again by itself.
        for _ in range(50):
            try:
                after = await store.accept_event(event("after"), [NewDelivery("crm")], T0)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the store never came back")
        assert not after.duplicate
        detail = await store.get_event(kept.event_id)
        assert detail is not None
        assert detail.event.idempotency_key == "before"
        assert await store.get_event(after.event_id) is not None
    finally:
        await store.close()
        remove_cluster(cluster)


async def test_content_search_uses_trigram_indexes(pg_url: str) -> None:
    """pg_trgm (PostgreSQL's contrib, a trusted extension) is installed by the
    migration, and the search's LIKE is answered by its GIN indexes."""
    connection = await asyncpg.connect(pg_url)
    try:
        assert (
            await connection.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'")
            == 1
        )
        await connection.execute("SET enable_seqscan = off")
        for column in ("text", "digits"):
            plan = "\n".join(
                row[0]
                for row in await connection.fetch(
                    f"EXPLAIN SELECT event_id FROM event_search WHERE {column} LIKE $1",
                    "%79991234567%",
                )
            )
            assert f"event_search_{column}" in plan, plan
    finally:
        await connection.close()


async def test_a_claim_committed_whose_answer_was_lost_is_taken_back_at_the_next_claim(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The database commits the claim, then the connection breaks before the
    # answer arrives (a crash or a network cut at that moment: seen in
    # test_a_database_restart_under_load_answers_503_then_recovers). The
    # delivery is leased to this live instance, which never learnt it: it
    # must not wait for the lease to run out (the timeout plus a minute).
    cutter = CommitCutter(pg_cluster.socket_dir, tmp_path)
    async with cutter.running():
        a = PostgresStore(cutter.url(pg_url), instance_id="a")
        b = PostgresStore(pg_url, instance_id="b")
        await a.open()
        await b.open()
        try:
            for store in (a, b):
                store.set_limits({"crm": TargetLimits(concurrency=1)})
            await a.accept_event(event(), [NewDelivery("crm")], T0)
            cutter.cut_next_commit()
            with pytest.raises(StoreError):
                await a.claim_due(T0, T0 + 3600, {"crm": 1})
            assert cutter.cut == 1
            assert await b.claim_due(T0 + 1, T0 + 3601, {"crm": 1}) == []  # a's, a is alive
            [again] = await a.claim_due(T0 + 1, T0 + 3601, {"crm": 1})
            assert again.attempts == 0  # nothing was sent for a claim never answered
            # Now under way: neither a's next claim nor b's takes it.
            assert await a.claim_due(T0 + 2, T0 + 3602, {"crm": 1}, exclude=[again.id]) == []
            assert await b.claim_due(T0 + 2, T0 + 3602, {"crm": 1}) == []
            done = AttemptRecord(1, T0 + 2, 0.1, "success", 200)
            await record(a, again, done, Delivered(), T0 + 3)
            view = await a.get_delivery(again.id)
            assert view is not None
            assert (view.status, view.attempts) == (Status.DELIVERED, 1)
        finally:
            await a.close()
            await b.close()


async def test_a_delivery_taken_back_from_a_lost_claim_is_not_taken_again_at_that_moment(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The claims' moment does not move (a FakeClock; claims at once): the
    # claim that takes the delivery back writes the lost claim's `now` into
    # it again. Handed out, it is under way: no claim at that moment takes
    # it once more, nor counts it free against the concurrency.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        a.set_limits({"crm": TargetLimits(concurrency=1)})
        for key in ("k1", "k2"):
            await a.accept_event(event(key), [NewDelivery("crm")], T0)
        cutter.cut_next_commit()
        with pytest.raises(StoreError):
            await a.claim_due(T0, T0 + 60, {"crm": 1})
        [again] = await a.claim_due(T0, T0 + 60, {"crm": 1})
        assert await a.claim_due(T0, T0 + 60, {"crm": 1}, exclude=[again.id]) == []
        assert await a.claim_due(T0, T0 + 60, {"crm": 1}) == []


async def test_an_attempt_whose_record_went_unanswered_is_recorded_once(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The record committed, its answer was lost; the scheduler records it
    # again (it keeps trying while the store is away). One attempt happened:
    # the history shows one, the target's failure streak counts one, and the
    # answer is the one the record had (0 failures before it, 1 after).
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
        [claimed] = await a.claim_due(T0, T0 + 60, {"crm": 1})
        failed = AttemptRecord(1, T0 + 1, 0.1, "retry", 503, "HTTP 503", b"")
        cutter.cut_next_commit()
        with pytest.raises(StoreError):
            await record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2)
        assert cutter.cut == 1
        streak = await record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2)
        assert (streak.before, streak.after) == (0, 1)
        detail = await a.get_event(claimed.event_id)
        assert detail is not None
        assert [attempt.number for attempt in detail.attempts[claimed.id]] == [1]
        view = await a.get_delivery(claimed.id)
        assert view is not None
        assert (view.status, view.attempts) == (Status.PENDING, 1)
        # The next attempt is a new one, recorded as such.
        [again] = await a.claim_due(T0 + 10, T0 + 70, {"crm": 1})
        second = AttemptRecord(2, T0 + 11, 0.1, "retry", 503, "HTTP 503", b"")
        streak = await record(a, again, second, RetryAt(T0 + 20), T0 + 12)
        assert (streak.before, streak.after) == (1, 2)


async def test_a_record_answered_again_says_what_it_did_to_the_target(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The attempt that made the target go down (and crossed the alerts'
    # failing_after) committed, its answer was lost. Its record made again
    # must say so: the scheduler learns the target is down from it, and the
    # "down" and "failing" alerts are told from it (relay.background.alerts.notes_on),
    # once, or never.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
        [claimed] = await a.claim_due(T0, T0 + 60, {"crm": 1})
        failed = AttemptRecord(1, T0 + 1, 0.1, "retry", 503, "HTTP 503", b"")
        hold = Hold(down_after=1, probe_at=T0 + 30)
        cutter.cut_next_commit()
        with pytest.raises(StoreError):
            await record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2, hold)
        assert cutter.cut == 1
        streak = await record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2, hold)
        assert (streak.before, streak.after, streak.went_down, streak.down) == (
            0,
            1,
            True,
            True,
        )
        assert set(await a.down_targets()) == {"crm"}


async def test_an_attempt_recorded_again_while_its_first_record_still_commits_is_kept_once(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The connection broke with the record's COMMIT still on its way: the
    # server holds that transaction open while the scheduler records the
    # attempt again, and commits it only then. Still one attempt.
    cutter = CommitCutter(pg_cluster.socket_dir, tmp_path)
    async with cutter.running():
        a = PostgresStore(cutter.url(pg_url), instance_id="a")
        await a.open()
        watcher = await asyncpg.connect(pg_url)
        try:
            await a.accept_event(event(), [NewDelivery("crm")], T0)
            [claimed] = await a.claim_due(T0, T0 + 60, {"crm": 1})
            failed = AttemptRecord(1, T0 + 1, 0.1, "retry", 503, "HTTP 503", b"")
            arrives = asyncio.Event()
            cutter.cut_next_commit(until=arrives)
            with pytest.raises(StoreError):
                await record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2)
            again = asyncio.create_task(record(a, claimed, failed, RetryAt(T0 + 10), T0 + 2))
            # Until the record made again waits for the first one's locks.
            async with asyncio.timeout(10):
                while not await watcher.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock')"
                ):
                    assert not again.done(), again
                    await asyncio.sleep(0.01)
            arrives.set()
            streak = await again
            assert cutter.cut == 1
            assert (streak.before, streak.after) == (0, 1)
            detail = await a.get_event(claimed.event_id)
            assert detail is not None
            assert [attempt.number for attempt in detail.attempts[claimed.id]] == [1]
            assert (await a.target_states())["crm"].consecutive_failures == 1
            view = await a.get_delivery(claimed.id)
            assert view is not None
            assert (view.status, view.attempts) == (Status.PENDING, 1)
        finally:
            await watcher.close()
            await a.close()


async def test_a_batch_whose_commit_answer_was_lost_is_503_and_a_keyed_retry_a_duplicate(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # docs/postgres.md, "When something goes away": a group commit whose
    # answer is lost answers every event in it unavailable (503), never
    # stored; the sender's keyed retry, made while that COMMIT is still on
    # its way, waits for it and is answered "duplicate" of the stored event.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        arrives = asyncio.Event()
        cutter.cut_next_commit(until=arrives)
        batch = [a.accept_event(event(f"k{n}"), [NewDelivery("crm")], T0) for n in range(3)]
        for outcome in await asyncio.gather(*batch, return_exceptions=True):
            assert isinstance(outcome, StoreUnavailable), outcome
        retry = asyncio.ensure_future(a.accept_event(event("k1"), [NewDelivery("crm")], T0))
        await asyncio.sleep(0.3)
        assert not retry.done()  # the key is locked by the transaction on its way
        arrives.set()
        accepted = await retry
        assert accepted.duplicate
        assert cutter.cut == 1
        stored = await a.list_events(EventQuery(route="orders"))
        assert sorted(view.idempotency_key or "" for view in stored) == ["k0", "k1", "k2"]


def corrected(original_id: int) -> Resend:
    return Resend(
        original_id=original_id,
        headers=(("Content-Type", "application/json"),),
        body=b'{"order": 7, "phone": "+7 900"}',
        content_type="application/json",
        targets=("crm",),
        by="dashboard session 1a2b3c4d from 127.0.0.1",
    )


async def copies_of(store: PostgresStore, original_id: int) -> list[int]:
    detail = await store.get_event(original_id)
    assert detail is not None
    return [link.copy_id for link in detail.resent_as]


async def test_a_resend_whose_answer_was_lost_makes_one_copy(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # A person resends a corrected order; the copy commits, the answer is
    # lost. What the person sees, and does next (press the button again),
    # must leave one copy: two would reach the CRM as two orders.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        original = await a.accept_event(event(), [NewDelivery("crm")], T0)
        cutter.cut_next_commit()
        try:
            copy_id = await a.resend(corrected(original.event_id), T0 + 5)
        except StoreError:
            copy_id = await a.resend(corrected(original.event_id), T0 + 9)  # again
        assert cutter.cut == 1
        assert await copies_of(a, original.event_id) == [copy_id]


async def test_a_resend_still_committing_when_its_connection_broke_makes_one_copy(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The COMMIT is on its way when the connection breaks: the server holds
    # the transaction open a while, then commits it.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        original = await a.accept_event(event(), [NewDelivery("crm")], T0)
        arrives = asyncio.Event()
        cutter.cut_next_commit(until=arrives)
        resending = asyncio.create_task(a.resend(corrected(original.event_id), T0 + 5))
        await asyncio.sleep(0.5)
        assert not resending.done()  # it waits to hear what became of it
        arrives.set()
        try:
            copy_id = await resending
        except StoreError:
            copy_id = await a.resend(corrected(original.event_id), T0 + 9)  # again
        assert cutter.cut == 1
        assert await copies_of(a, original.event_id) == [copy_id]


async def test_a_resend_lost_with_the_database_out_of_reach_is_one_copy_when_pressed_again(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The answer is lost and the database is out of reach at once: nobody can
    # tell now whether the copy was stored. The person is told it failed and
    # presses again once the database is back: still one copy.
    async with through_cutter(pg_cluster, pg_url, tmp_path, command_timeout=2) as (cutter, a):
        original = await a.accept_event(event(), [NewDelivery("crm")], T0)
        cutter.cut_next_commit(away=True)
        with pytest.raises(StoreError):
            await a.resend(corrected(original.event_id), T0 + 5)
        assert cutter.cut == 1
        cutter.come_back()
        copy_id = await a.resend(corrected(original.event_id), T0 + 30)
        assert await copies_of(a, original.event_id) == [copy_id]
        # Another resend of the same correction, asked for after that
        # answer, is a person's choice: a second copy.
        assert await a.resend(corrected(original.event_id), T0 + 60) != copy_id


async def test_a_requeue_of_delivered_deliveries_whose_answer_was_lost_sends_them_once_more(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # `relay requeue --status delivered 7`: one more send, asked once. The
    # requeue commits, its answer is lost, the scheduler sends it again at
    # once; the person, told it failed, runs the command again.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        accepted = await a.accept_event(event(), [NewDelivery("crm")], T0)
        [claimed] = await a.claim_due(T0, T0 + 60, {"crm": 1})
        done = AttemptRecord(1, T0 + 1, 0.1, "success", 200)
        await record(a, claimed, done, Delivered(), T0 + 2)
        again = Selection(status=Status.DELIVERED, ids=(claimed.id,))
        cutter.cut_next_commit()
        try:
            requeued = await a.requeue(again, T0 + 5)
        except StoreError:
            requeued = None
        assert cutter.cut == 1
        [resent] = await a.claim_due(T0 + 6, T0 + 66, {"crm": 1})
        done = AttemptRecord(2, T0 + 6, 0.1, "success", 200)
        await record(a, resent, done, Delivered(), T0 + 7)
        if requeued is None:
            requeued = await a.requeue(again, T0 + 9)  # the person, again
        assert requeued == [claimed.id]
        assert await a.claim_due(T0 + 10, T0 + 70, {"crm": 1}) == []
        detail = await a.get_event(accepted.event_id)
        assert detail is not None
        assert [entry.kind for entry in detail.log[claimed.id]] == ["requeue"]


async def test_a_requeue_lost_with_the_database_away_pressed_twice_at_once_is_made_once(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The answer is lost and the database out of reach; once it is back the
    # person presses twice (two tabs, a double click): both ask what became
    # of the first, both hear it committed, and neither fails for the other.
    async with through_cutter(pg_cluster, pg_url, tmp_path, command_timeout=2) as (cutter, a):
        accepted = await a.accept_event(event(), [NewDelivery("crm")], T0)
        [claimed] = await a.claim_due(T0, T0 + 60, {"crm": 1})
        done = AttemptRecord(1, T0 + 1, 0.1, "success", 200)
        await record(a, claimed, done, Delivered(), T0 + 2)
        again = Selection(status=Status.DELIVERED, ids=(claimed.id,))
        cutter.cut_next_commit(away=True)
        with pytest.raises(StoreError):
            await a.requeue(again, T0 + 5)
        assert cutter.cut == 1
        cutter.come_back()
        answers = await asyncio.gather(
            a.requeue(again, T0 + 9), a.requeue(again, T0 + 9), return_exceptions=True
        )
        assert answers == [[claimed.id], [claimed.id]]
        detail = await a.get_event(accepted.event_id)
        assert detail is not None
        assert [entry.kind for entry in detail.log[claimed.id]] == ["requeue"]


async def test_an_alert_note_whose_answer_was_lost_is_noted_once(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # An instance notes what its attempts saw; the note commits, the answer is
    # lost, and the alerter stores it again: one note, or the leader says it
    # twice (in two alerts, when it sends between the two).
    async with through_cutter(pg_cluster, pg_url, tmp_path, command_timeout=2) as (cutter, a):
        for away in (False, True):
            alerter = Alerter(
                AlertsConfig(target="ops"),
                a,
                FakeClock(T0),
                shared=a,
                leading=lambda: False,
            )
            alerter.problem(f"database: disk almost full ({away})")
            cutter.cut_next_commit(away=away)
            await alerter.flush()
            assert cutter.cut == 1 + away
            cutter.come_back()
            alerter.problem(f"database: back ({away})")  # noted meanwhile
            await alerter.flush()  # what was not stored is stored now
            notes = [note.note for note in await a.alert_notes()]
            assert len(notes) == len(set(notes)) == 2 + 2 * away, notes


async def test_an_alert_whose_answer_was_lost_is_sent_once(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    # The leader's alert commits (its notes taken away with it) while its
    # COMMIT's answer is lost, the transaction still open on the server when
    # the leader looks again: it still sees the notes, and sends nothing more.
    async with through_cutter(pg_cluster, pg_url, tmp_path) as (cutter, a):
        await a.note_alerts([b'{"kind": "dead", "n": 1}'], T0)
        ids = [note.id for note in await a.alert_notes()]
        arrives = asyncio.Event()
        cutter.cut_next_commit(until=arrives)
        with pytest.raises(StoreError):
            await a.send_alert(ids, event(body=b"1"), [NewDelivery("ops")], T0 + 61)
        again = [note.id for note in await a.alert_notes()]
        assert again == ids  # not committed yet
        sending = asyncio.create_task(
            a.send_alert(again, event(body=b"2"), [NewDelivery("ops")], T0 + 62)
        )
        await asyncio.sleep(0.3)
        assert not sending.done()  # waits for the notes' locks
        arrives.set()
        assert await sending is None
        assert cutter.cut == 1
        assert await a.alert_notes() == []
        assert len(await a.list_events(EventQuery(route="orders"))) == 1  # one alert


async def test_notes_being_stored_when_the_alerter_stops_are_stored_once(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # relay stops while the alerter's task is storing its notes (a slow
    # database at shutdown: another session holds alert_notes locked): stop()'s
    # own flush must not store that batch a second time, or the leader says
    # those deliveries went dead twice.
    a, _ = two
    alerter = Alerter(
        AlertsConfig(target="ops"), None, FakeClock(0.0), shared=a, leading=lambda: False
    )
    locker = await asyncpg.connect(pg_url)
    running: asyncio.Task[None] | None = None
    try:
        locking = locker.transaction()
        await locking.start()
        await locker.execute("LOCK TABLE alert_notes IN ACCESS EXCLUSIVE MODE")
        running = asyncio.create_task(alerter.run())
        alerter.problem("database: disk almost full")

        async def insert_waits() -> bool:
            return bool(
                await locker.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
                    " AND relation = 'alert_notes'::regclass)"
                )
            )

        await poll_until(insert_waits, timeout=5)
        stopping = asyncio.create_task(alerter.stop())
        await asyncio.sleep(0.05)
        await locking.commit()
        async with asyncio.timeout(10):
            await stopping
            await running
    finally:
        await locker.close()
        if running is not None and not running.done():
            running.cancel()
    assert [note.note for note in await a.alert_notes()] == [
        b'{"kind":"problem","text":"database: disk almost full"}'
    ]


async def test_a_dead_instances_leases_are_taken_over_before_they_expire(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    a, b = two
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    [held] = await a.claim_due(T0, T0 + 3600, {"crm": 1})
    assert await b.claim_due(T0 + 1, T0 + 61, {"crm": 1}) == []  # a is alive: its lease holds
    await a.close()  # a's heartbeats stop; make it look unseen for a minute (server clock)
    connection = await asyncpg.connect(pg_url)
    try:
        await connection.execute("UPDATE instances SET alive_at = alive_at - 60 WHERE id = 'a'")
    finally:
        await connection.close()
    [taken] = await b.claim_due(T0 + 1, T0 + 61, {"crm": 1})
    assert taken.id == held.id
    # a's attempt was interrupted: b's is the second (X-Relay-Attempt: 2),
    # its retry budget untouched.
    assert (taken.attempts, taken.attempts_in_cycle) == (1, 0)


async def test_a_silence_the_claimer_shared_is_no_sign_that_another_instance_is_gone(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The database out of reach for longer than dead_after, for every
    instance: each one's heartbeats stopped, so by the server's clock each
    looks gone when it is back. The first back must not take the others'
    leases as a dead instance's (seen with three instances after a 15 s
    outage: a delivery sent by all three at once, up to 11 times; two probes
    of a down target; an order_by line overtaken). Only once it has itself
    been back for dead_after does another's silence mean that one is gone."""
    dead_after = 1.0
    cutters = [CommitCutter(pg_cluster.socket_dir, tmp_path / name) for name in "ab"]
    for cutter in cutters:
        cutter.socket_dir.mkdir()
    async with cutters[0].running(), cutters[1].running():
        a, b = (
            PostgresStore(
                cutter.url(pg_url), instance_id=name, dead_after=dead_after, command_timeout=2
            )
            for cutter, name in zip(cutters, "ab", strict=True)
        )
        await a.open()
        await b.open()
        try:
            await a.accept_event(event(), [NewDelivery("crm")], T0)
            [held] = await a.claim_due(T0, T0 + 3600, {"crm": 1})
            assert await b.claim_due(T0, T0 + 3600, {"crm": 1}) == []  # a is alive
            for cutter in cutters:
                cutter.go_away()
            await asyncio.sleep(dead_after * 1.5)  # silent for longer, by the server's clock
            cutters[1].come_back()  # b is back; a is not yet
            assert await claimed_when_back(b, T0 + 2, {"crm": 1}) == []
            # b has been back for a minute, a silent all along: a is gone.
            connection = await asyncpg.connect(pg_url)
            try:
                await connection.execute(
                    "UPDATE instances SET back_at = back_at - 60 WHERE id = 'b'"
                )
            finally:
                await connection.close()
            [taken] = await b.claim_due(T0 + 3, T0 + 3600, {"crm": 1})
            assert taken.id == held.id
        finally:
            cutters[0].come_back()
            await a.close()
            await b.close()


async def claimed_when_back(
    store: PostgresStore, now: float, limits: dict[str, int]
) -> list[ClaimedDelivery]:
    """The store's first claim once its pool has connected again."""
    for _ in range(100):
        try:
            return await store.claim_due(now, now + 3600, limits)
        except StoreUnavailable:
            await asyncio.sleep(0.05)
    pytest.fail("the store never came back")


async def test_concurrency_is_a_total_across_instances(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=3)})
    for _ in range(10):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    claims = await asyncio.gather(
        *(store.claim_due(T0, T0 + 60, {"crm": 3}) for store in (a, b, a, b))
    )
    assert sum(len(claim) for claim in claims) == 3
    # An attempt finished frees a place for any instance: the one that held
    # it gives it back (only a lease's owner can), the other takes the place.
    # (Which instance won the claims above is up to the race.)
    owner, first = next(
        (store, c) for store, claim in zip((a, b, a, b), claims, strict=True) for c in claim
    )
    await owner.release([first.id], T0)
    other = b if owner is a else a
    assert len(await other.claim_due(T0, T0 + 60, {"crm": 3})) == 1


async def test_a_rate_is_a_total_across_instances(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=10, paces=(("target:crm", 0.2),))})
    for _ in range(5):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    assert len(await a.claim_due(T0, T0 + 60, {"crm": 5})) == 1  # no bursts
    assert await b.claim_due(T0 + 0.1, T0 + 60, {"crm": 5}) == []  # a took this slot
    assert len(await b.claim_due(T0 + 0.2, T0 + 60, {"crm": 5})) == 1
    assert await a.claim_due(T0 + 0.3, T0 + 60, {"crm": 5}) == []


async def test_a_receivers_wait_holds_the_target_for_every_instance(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # A 429's wait (Telegram's retry_after) recorded by one instance: the
    # other sends nothing into the paces it is about (the chat's), and the
    # bot's other chats go on (relay.targets.telegram.held_by_a_wait).
    a, b = two
    paces = (("group:telegram-chat-1", 1.0), ("group:telegram-bot-1", 1 / 30))
    limits = TargetLimits(concurrency=1, paces=paces, held_paces=("group:telegram-chat-1",))
    for store in (a, b):
        store.set_limits({"chat": limits})
    for _ in range(3):
        await a.accept_event(event(), [NewDelivery("chat")], T0)
    [first] = await a.claim_due(T0, T0 + 60, {"chat": 1})
    flood = AttemptRecord(1, T0, 0.01, "retry", 429, "Telegram: Too Many Requests")
    await record(a, first, flood, RetryAt(T0, hold_until=T0 + 30), T0 + 0.1)
    assert await b.claim_due(T0 + 29, T0 + 89, {"chat": 1}) == []
    assert (await b.next_due(["chat"]))["chat"] >= T0 + 30
    connection = await asyncpg.connect(pg_url)
    try:
        bot = await connection.fetchval(
            "SELECT next_at FROM pacing WHERE name = 'group:telegram-bot-1'"
        )
    finally:
        await connection.close()
    assert bot < T0 + 1  # the bot was not held
    [again] = await b.claim_due(T0 + 30, T0 + 90, {"chat": 1})
    assert again.id == first.id  # lined up by arrival: the first goes first


async def test_a_down_target_gives_one_probe_to_the_cluster_when_its_time_comes(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    # The claim reads the down state from the database, whatever an instance
    # remembers: b never learnt that a's failures made the target down.
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=4, hold_when_down=True)})
    for _ in range(5):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    failed = AttemptRecord(1, T0, 0.01, "retry", 503, "HTTP 503")
    for claimed in await a.claim_due(T0, T0 + 60, {"crm": 3}):
        await record(a, claimed, failed, RetryAt(T0 + 2), T0, Hold(3, T0 + 10))
    assert "crm" in await b.down_targets()
    assert await b.claim_due(T0 + 5, T0 + 65, {"crm": 4}) == []  # its first probe is at T0 + 10
    [probe] = await b.claim_due(T0 + 10, T0 + 70, {"crm": 4})
    assert probe.probe is not None
    assert (probe.probe.probe_at, probe.probe.probes) == (T0 + 10, 0)
    # One probe at a time, for the whole cluster.
    assert await a.claim_due(T0 + 11, T0 + 71, {"crm": 4}) == []
    probe_failed = AttemptRecord(probe.attempts + 1, T0 + 11, 0.01, "retry", 503, "HTTP 503")
    await record(b, probe, probe_failed, Waits(T0 + 30), T0 + 11, Hold(3, T0 + 30, probe=True))
    assert await a.claim_due(T0 + 20, T0 + 80, {"crm": 4}) == []  # the next probe is at T0 + 30
    [second] = await a.claim_due(T0 + 30, T0 + 90, {"crm": 4})
    assert second.probe is not None
    assert second.probe.probes == 1
    assert second.id != probe.id  # the failed probe went to the back of the line
    # It answers: the target is up, and the others go as usual.
    ok = AttemptRecord(second.attempts + 1, T0 + 30, 0.01, "success", 200)
    await record(a, second, ok, Delivered(), T0 + 30, Hold(3, T0 + 60, probe=True))
    rest = await b.claim_due(T0 + 31, T0 + 91, {"crm": 4})
    assert len(rest) == 4
    assert all(claimed.probe is None for claimed in rest)


async def test_a_claim_waits_for_an_attempt_being_recorded_to_say_whether_the_target_is_down(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # An attempt being recorded holds its target's row (relay's record takes
    # it FOR UPDATE); if it makes the target down, its deliveries are lined
    # up, due at once. A claim meanwhile must not read "up" first and take
    # them after: it waits for the record, then sees the target down.
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=4, hold_when_down=True)})
    for _ in range(3):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    recording = await asyncpg.connect(pg_url)
    try:
        await recording.execute("INSERT INTO targets (name) VALUES ('crm')")
        async with recording.transaction():
            await recording.execute("SELECT 1 FROM targets WHERE name = 'crm' FOR UPDATE")
            claim = asyncio.create_task(b.claim_due(T0, T0 + 60, {"crm": 4}))

            async def claim_waits() -> bool:
                return bool(
                    await recording.fetchval(
                        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND application_name = 'relay/b'"
                    )
                )

            await poll_until(claim_waits)
            await recording.execute(
                "UPDATE targets SET down_since = $1, probe_at = $2 WHERE name = 'crm'",
                T0,
                T0 + 10,
            )
        assert await claim == []  # down, its first probe at T0 + 10
    finally:
        await recording.close()


async def test_a_success_after_a_success_waits_for_no_other_instances_record(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # Another instance recording an attempt of the same target holds its row
    # (FOR UPDATE) to its commit. A success after a success changes nothing of
    # that row (relay.store.health), so it takes no lock: recorded meanwhile,
    # not after. Three instances' successes used to take turns on that lock.
    a, _ = two
    for _ in range(3):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    first, second, third = await a.claim_due(T0, T0 + 60, {"crm": 3})
    ok = AttemptRecord(1, T0, 0.01, "success", 200)
    await record(a, first, ok, Delivered(), T0 + 1)
    recording = await asyncpg.connect(pg_url)
    try:
        async with recording.transaction():
            await recording.execute("SELECT 1 FROM targets WHERE name = 'crm' FOR UPDATE")
            streak = await asyncio.wait_for(record(a, second, ok, Delivered(), T0 + 1.5), 5)
            assert (streak.before, streak.after) == (0, 0)
            # The time shown would lag a second: this one writes, so it waits.
            late = asyncio.create_task(record(a, third, ok, Delivered(), T0 + 2.5))
            await asyncio.sleep(0.3)
            assert not late.done()
        await asyncio.wait_for(late, 5)
    finally:
        await recording.close()
    states = await a.target_states()
    assert states["crm"].last_success_at == T0 + 2.5
    for claim in (second, third):
        view = await a.get_delivery(claim.id)
        assert view is not None
        assert view.status is Status.DELIVERED


async def test_a_line_joined_while_its_head_is_recorded_delivered_moves_on(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # An event of ordering key A accepted on one instance while another
    # records the line's head delivered: the accept saw the head in flight
    # and stored its delivery waiting its turn; the record, not seeing that
    # uncommitted delivery, let nothing go. The line then waited for ever.
    # Both take the line's lock, so one sees the other's work.
    a, _ = two
    await a.accept_event(event("e1"), [NewDelivery("crm", order_key="A")], T0)
    [head] = await a.claim_due(T0, T0 + 60, {"crm": 5})
    accepting = await asyncpg.connect(pg_url)
    try:
        async with accepting.transaction():
            [accepted] = await store_batch(
                accepting, [AcceptJob(event("e2"), [NewDelivery("crm", order_key="A")], T0 + 1)]
            )
            ok = AttemptRecord(1, T0 + 1, 0.01, "success", 200)
            recording = asyncio.create_task(record(a, head, ok, Delivered(), T0 + 1))
            await asyncio.sleep(0.3)
        await asyncio.wait_for(recording, 5)
    finally:
        await accepting.close()
    [second] = await a.claim_due(T0 + 2, T0 + 62, {"crm": 5})
    assert second.event_id == accepted.event_id


async def test_one_leader_at_a_time_and_the_lead_moves_when_it_goes(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    assert await a.lead()
    assert not await b.lead()
    assert await a.lead()  # still
    await a.close()  # its session ends, and the lock with it
    assert await b.lead()


async def test_a_name_is_held_by_one_running_instance(pg_url: str) -> None:
    a = PostgresStore(pg_url, instance_id="vps1")
    b = PostgresStore(pg_url, instance_id="vps1")
    await a.open()
    await b.open()  # database commands open the store too: only serving holds the name
    try:
        assert await a.lead()
        with pytest.raises(StoreError, match="another relay instance named 'vps1' is running"):
            await b.lead()
        await a.close()
        assert await b.lead()
    finally:
        await a.close()
        await b.close()


async def test_alert_notes_from_two_instances_are_sent_once(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    await a.note_alerts([b'{"kind": "dead", "n": 1}'], T0)
    await b.note_alerts([b'{"kind": "dead", "n": 2}', b'{"kind": "up", "n": 3}'], T0 + 1)
    notes = await b.alert_notes()
    assert [(n.noted_at, n.note) for n in notes] == [
        (T0, b'{"kind": "dead", "n": 1}'),
        (T0 + 1, b'{"kind": "dead", "n": 2}'),
        (T0 + 1, b'{"kind": "up", "n": 3}'),
    ]
    ids = [n.id for n in notes]
    # Two instances that both think they lead (the lock just moved) send once.
    sent = await asyncio.gather(
        a.send_alert(ids[1:], event(body=b"a"), [NewDelivery("ops")], T0 + 2),
        b.send_alert(ids[1:], event(body=b"b"), [NewDelivery("ops")], T0 + 2),
    )
    assert sum(accepted is not None for accepted in sent) == 1
    # Notes partly sent already: nothing is sent, nothing taken.
    assert await a.send_alert(ids, event(), [NewDelivery("ops")], T0 + 2) is None
    assert [n.id for n in await a.alert_notes()] == ids[:1]
    assert await a.send_alert(ids[:1], event(), [NewDelivery("ops")], T0 + 2) is not None
    assert await a.alert_notes() == []
    alerts = await a.list_events(EventQuery(route="orders"))
    assert len(alerts) == 2
    # Notes are dropped without an alert when there is nothing to send them to.
    await a.note_alerts([b"{}"], T0 + 3)
    assert await a.send_alert([n.id for n in await a.alert_notes()], None, [], T0 + 3) is None
    assert await a.alert_notes() == []
    assert len(await a.list_events(EventQuery(route="orders"))) == 2


async def test_wake_ups_reach_the_other_instances(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    heard: list[str] = []
    listening = asyncio.create_task(b.listen(heard.append))
    try:
        await eventually(lambda: "listening" in heard)
        await a.accept_event(event(), [NewDelivery("crm")], T0)
        await eventually(lambda: "event" in heard)
        await a.set_paused("crm", True, T0)
        await eventually(lambda: "pause" in heard)
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening


async def leases_run_out(url: str, seconds: float) -> None:
    """Every lease as the server's clock will see it `seconds` from now."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE deliveries SET lease_expires = lease_expires - $1", seconds
        )
    finally:
        await connection.close()


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.01)


async def test_a_store_that_never_leases_leaves_no_instance_behind(pg_url: str) -> None:
    # Database commands (relay stats, events, retry...) open the store and
    # close it again without claiming anything. Each one left a row in
    # `instances` under a random id for ever: one a command, a row a cron run.
    command = PostgresStore(pg_url)
    await command.open()
    await command.accept_event(event("from-a-command"), [NewDelivery("crm")], T0)
    await command.stats()
    await asyncio.sleep(command.dead_after / 5 + 0.2)  # past a heartbeat's interval
    await command.close()
    worker = PostgresStore(pg_url, instance_id="worker")
    await worker.open()
    try:
        await worker.claim_due(T0, T0 + 60, {"crm": 1})
        connection = await asyncpg.connect(pg_url)
        try:
            ids = {row[0] for row in await connection.fetch("SELECT id FROM instances")}
        finally:
            await connection.close()
        assert ids == {"worker"}  # the one that leased, and only it
    finally:
        await worker.close()


async def test_the_instances_each_with_host_heartbeat_leases_and_the_leader(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    # An operator of three instances saw no list, no leader, no heartbeat
    # ages (issue 40): `relay stats`, the API and the dashboard read this.
    a, b = two
    assert await b.instances() == []  # opened only: not serving yet
    for store in (a, b):
        await store.recover_orphans(T0)  # `relay serve` starts
    await a.accept_event(event(), [NewDelivery("crm")], T0)
    await a.claim_due(T0, T0 + 60, {"crm": 1})
    assert await b.lead()
    listed = await a.instances()
    assert [(i.id, i.state, i.leader, i.leases) for i in listed] == [
        ("a", "alive", False, 1),
        ("b", "alive", True, 0),
    ]
    assert all(i.host == socket.gethostname() for i in listed)
    assert all(i.heartbeat_age is not None and i.heartbeat_age < 5 for i in listed)
    first_start = listed[0].started_at
    await a.close()
    [gone, _] = await b.instances()
    assert (gone.id, gone.state, gone.leases) == ("a", "stopped", 1)
    assert gone.last_heartbeat is not None  # kept: when it was last heard of
    # Started again under its name: the row says when this start was.
    again = PostgresStore(pg_url, instance_id="a")
    await again.open()
    try:
        await again.recover_orphans(T0 + 1)
        [restarted, _] = await b.instances()
        assert restarted.state == "alive"
        assert restarted.started_at > first_start
        assert restarted.leases == 0  # its own lease, given back at its start
    finally:
        await again.close()


async def test_every_connection_of_an_instance_carries_its_name(pg_url: str) -> None:
    # 39 connections for 3 instances, none named (issue 40): the pool, the
    # heartbeats, the lead and the wake-ups each say relay/<instance>.
    store = PostgresStore(pg_url, instance_id="vps1")
    await store.open()
    heard: list[str] = []
    listening = asyncio.create_task(store.listen(heard.append))
    try:
        await store.recover_orphans(T0)  # starts the heartbeats
        assert await store.lead()
        await eventually(lambda: "listening" in heard)
        connection = await asyncpg.connect(pg_url)
        try:

            async def names() -> list[str]:
                return [
                    row[0]
                    for row in await connection.fetch(
                        "SELECT application_name FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ]

            deadline = asyncio.get_running_loop().time() + 5
            while len(await names()) < 4:  # pool, heartbeat, lead, listener
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            assert set(await names()) == {"relay/vps1"}
        finally:
            await connection.close()
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        await store.close()


def held_crm(make_config: ConfigFactory, url: str) -> Config:
    return make_config(
        {"crm": {"type": "http", "url": url, "hold_when_down": True, "down_after": 3}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        retry={"retries": 3},  # 2, 4, 8 s: four failed attempts make a delivery dead
    )


async def instances(
    pg_url: str,
    config: Config,
    clock: FakeClock,
    reports: list[tuple[float, AttemptReport]],
    names: str,
    poll_interval: float = 1.0,
) -> tuple[list[PostgresStore], list[Scheduler], list[Target]]:
    """An instance per name: its store, its scheduler (reporting each attempt
    with the clock's time) and its targets, started."""
    stores, schedulers, started = [], [], []
    for number, name in enumerate(names):
        store = PostgresStore(pg_url, instance_id=name)
        await store.open()
        store.reconfigure(config)
        stores.append(store)
        targets = {name: build_target(target) for name, target in config.targets.items()}
        for target in targets.values():
            await target.start()
            started.append(target)
        schedulers.append(
            Scheduler(
                store,
                config,
                targets,
                clock,
                rng=random.Random(number),
                poll_interval=poll_interval,
                on_attempt=lambda report: reports.append((clock.now(), report)),
            )
        )
    return stores, schedulers, started


async def test_a_down_target_holds_across_instances_one_probe_at_a_time_no_retry_spent(
    pg_url: str, make_config: ConfigFactory, aiohttp_server: AiohttpServer
) -> None:
    # Three instances, each a store and a scheduler of its own, driven turn by
    # turn on one clock as their loops interleave (a finished attempt wakes
    # its scheduler at once; each re-reads the held targets once a second).
    # The receiver fails for 40 s: after 3 failures the target is down for
    # the whole cluster. Before, an instance that had not read the down state
    # yet kept claiming deliveries the failure had lined up (due at once) and
    # spent their retries within one instant; and each instance sent a probe.
    clock = FakeClock(T0)
    back_at = T0 + 40
    answers: list[tuple[float, int, int]] = []  # (clock time, event, status)

    async def crm(request: web.Request) -> web.Response:
        n = json.loads(await request.read())["n"]
        status = 503 if clock.now() < back_at else 200
        answers.append((clock.now(), n, status))
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/crm", crm)
    server = await aiohttp_server(app)
    config = held_crm(make_config, str(server.make_url("/crm")))
    reports: list[tuple[float, AttemptReport]] = []
    stores, schedulers, started_targets = await instances(pg_url, config, clock, reports, "abc")
    try:
        for n in range(24):
            await stores[0].accept_event(
                event(body=json.dumps({"n": n}).encode()), [NewDelivery("crm")], T0
            )
        # Turns while the target is down, before and after: how many attempts
        # each started (a turn ends when every attempt it started is recorded).
        while_down: list[int] = []
        while clock.now() < T0 + 120 and sum(s == 200 for _, _, s in answers) < 24:
            while True:
                down_before = "crm" in await stores[0].down_targets()
                started = 0
                for scheduler in schedulers:
                    started += await scheduler.step()
                await asyncio.gather(*(scheduler.wait_idle() for scheduler in schedulers))
                if down_before and "crm" in await stores[0].down_targets():
                    while_down.append(started)
                if not started:
                    break
            clock.advance(0.5)

        assert await stores[0].count(Selection(status=Status.DEAD)) == 0
        delivered = sorted(n for _, n, status in answers if status == 200)
        assert delivered == list(range(24))  # each once
        # Never two probes at once: while down, one attempt per turn at most.
        assert while_down
        assert max(while_down) == 1
        # No attempt of the cycle before its backoff while the receiver failed
        # (once it is back, the deliveries that waited go at once, by design).
        last: dict[int, tuple[float, AttemptReport]] = {}
        for at, report in reports:
            previous = last.get(report.delivery.id)
            last[report.delivery.id] = (at, report)
            if previous is None or at >= back_at or report.kind is not AttemptKind.CYCLE:
                continue
            before_at, before = previous
            if before.kind is AttemptKind.CYCLE and before.decision.next is Status.PENDING:
                assert before.decision.at is not None
                assert at >= before.decision.at, (report.delivery.id, before_at, at)
        probes = [at for at, report in reports if report.kind is AttemptKind.PROBE]
        assert probes
        assert len(probes) == len(set(probes))
    finally:
        for target in started_targets:
            await target.close()
        for store in stores:
            await store.close()


async def test_an_instance_that_has_not_read_the_down_state_sends_the_probe_as_a_probe(
    pg_url: str, make_config: ConfigFactory, aiohttp_server: AiohttpServer
) -> None:
    # b last read the targets when crm was up (and would not again for an
    # hour); a's failures made it down. The probe b's claim gets is a probe:
    # it spends no retry and goes to the back of the line, as a's would.
    clock = FakeClock(T0)

    async def crm(request: web.Request) -> web.Response:
        return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/crm", crm)
    server = await aiohttp_server(app)
    config = held_crm(make_config, str(server.make_url("/crm")))
    reports: list[tuple[float, AttemptReport]] = []
    stores, schedulers, started = await instances(pg_url, config, clock, reports, "ab", 3600)
    a, b = schedulers
    try:
        assert await b.step() == 0  # crm is up, nothing waits
        for n in range(3):
            body = json.dumps({"n": n}).encode()
            await stores[0].accept_event(event(body=body), [NewDelivery("crm")], T0)
        assert await a.step() == 3
        await a.wait_idle()
        assert "crm" in a.down
        assert "crm" not in b.down
        clock.set(T0 + 2)  # the first probe's time
        assert await b.step() == 1
        await b.wait_idle()
        _, report = reports[-1]
        assert report.kind is AttemptKind.PROBE
        assert report.cycle_step is None  # no retry spent
        assert b.down["crm"].probes == 1  # learnt from the claim, then its own probe
        assert await a.step() == 0  # the next probe is 4 s on
        view = await stores[0].get_delivery(report.delivery.id)
        assert view is not None
        assert view.status is Status.PENDING
    finally:
        for target in started:
            await target.close()
        for store in stores:
            await store.close()


async def test_deliveries_stored_before_identities_keep_the_key_they_were_sent_with(
    pg_url: str,
) -> None:
    async def roll_back(store: Store, untagged: list[int]) -> Store:
        # Migration 10 undone, as SQLite's 13 is (test_sqlite.py).
        await store.close()
        connection = await asyncpg.connect(pg_url)
        try:
            await connection.execute("ALTER TABLE deliveries DROP COLUMN event_keyed")
            await connection.execute("DELETE FROM schema_migrations WHERE version = 10")
            await connection.execute(
                "UPDATE deliveries SET message_tag = NULL WHERE id = ANY($1::bigint[])", untagged
            )
        finally:
            await connection.close()
        again = PostgresStore(pg_url)
        await again.open()
        return again

    store = PostgresStore(pg_url)
    await store.open()
    store = await identities_survive_their_migration(store, roll_back)
    await store.close()


async def test_a_throttle_holds_the_target_for_every_instance(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """A 429 met by one instance holds the target for the cluster (rule 4 of
    relay.delivery.step): none claims before the hold ends, then one
    delivery goes alone until an answer other than a throttle ends it."""
    a, b = two
    for store in (a, b):
        store.set_limits({"crm": TargetLimits(concurrency=4)})
    for _ in range(4):
        await a.accept_event(event(), [NewDelivery("crm")], T0)
    [first] = await a.claim_due(T0, T0 + 70, {"crm": 1})
    too_many = Outcome.retry("HTTP 429", 429, throttle=True)
    rules = Rules(RetryPolicy(jitter=0))

    async def answered(
        store: PostgresStore, claim: ClaimedDelivery, outcome: Outcome, at: float
    ) -> None:
        attempt = AttemptRecord(1, at, 0.01, outcome.verdict.value, outcome.status)
        decide = functools.partial(step, rules, Attempted(claim, outcome, at, started=at))
        await store.record_attempt(claim, attempt, decide, at)

    await answered(a, first, too_many, T0)  # held for the first retry's delay: 2 s
    assert await b.claim_due(T0 + 1, T0 + 70, {"crm": 4}) == []
    [alone] = await b.claim_due(T0 + 3, T0 + 70, {"crm": 4})
    assert alone.id == first.id  # the one that met the 429 is first in line
    assert await a.claim_due(T0 + 3, T0 + 70, {"crm": 4}) == []  # one at a time
    await answered(b, alone, Outcome.success(200), T0 + 3)
    assert len(await a.claim_due(T0 + 3, T0 + 70, {"crm": 4})) == 3  # the episode is over


async def test_a_lead_arriving_at_a_quiet_target_held_down_by_a_poison_probes_it_for_the_cluster(
    pg_url: str, make_config: ConfigFactory, aiohttp_server: AiohttpServer
) -> None:
    # The poison payload of a quiet target made it down (relay.delivery.step,
    # rule 3), and its probes are an hour apart. A lead stored by instance c
    # is fresh evidence for every instance: b, which never saw the target
    # fail, sends it as the probe within FRESH_PROBE_GAP of the last probe,
    # one probe for the cluster; the target is up, and the poison fails alone.
    clock = FakeClock(T0)
    answers: list[tuple[float, int, int]] = []

    async def crm(request: web.Request) -> web.Response:
        n = json.loads(await request.read())["n"]
        status = 503 if n == 0 else 200
        answers.append((clock.now(), n, status))
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/crm", crm)
    server = await aiohttp_server(app)
    config = make_config(
        {
            "crm": {
                "type": "http",
                "url": str(server.make_url("/crm")),
                "hold_when_down": True,
                "down_after": 3,
            }
        },
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        retry={"delays": ["1h"], "retries": 3},
    )
    reports: list[tuple[float, AttemptReport]] = []
    stores, schedulers, started = await instances(pg_url, config, clock, reports, "abc")
    a, b, c = schedulers
    try:
        await stores[0].accept_event(
            event(body=json.dumps({"n": 0}).encode()), [NewDelivery("crm")], T0
        )
        for turn in range(3):  # the poison's three failures, an hour apart
            clock.set(T0 + turn * 3600)
            assert await a.step() == 1
            await a.wait_idle()
        down = (await stores[0].down_targets())["crm"]
        assert down.probe_at == clock.now() + 3600
        probed = clock.now()

        clock.set(probed + 1)
        body = json.dumps({"n": 1}).encode()
        lead = event(body=body)._replace(received_at=clock.now())
        await stores[2].accept_event(lead, [NewDelivery("crm")], clock.now())
        for scheduler in schedulers:  # each reads the targets at its poll
            assert await scheduler.step() == 0
        clock.set(probed + FRESH_PROBE_GAP)
        counts = [await b.step(), await a.step(), await c.step()]
        await asyncio.gather(*(s.wait_idle() for s in schedulers))
        assert counts == [1, 0, 0]  # one probe, for the whole cluster
        assert answers[-1] == (probed + FRESH_PROBE_GAP, 1, 200)
        assert reports[-1][1].kind is AttemptKind.PROBE
        assert await stores[1].down_targets() == {}

        # Up, the poison fails alone on its own schedule: dead after its retries.
        for _ in range(10):
            clock.advance(3600)
            await a.step()
            await a.wait_idle()
        assert await stores[0].down_targets() == {}
        assert await stores[0].count(Selection(status=Status.DEAD)) == 1
        assert [n for _, n, status in answers if status == 200] == [1]
    finally:
        for target in started:
            await target.close()
        for store in stores:
            await store.close()


async def test_the_leader_judges_silence_for_the_cluster_and_the_next_one_goes_on(
    pg_url: str, make_config: ConfigFactory
) -> None:
    # Events stored through both instances; only the leading instance's
    # silence watch learns and judges (a follower's passes do nothing), and
    # what it said is in the database: the next leader neither says it again
    # nor misses that the route is back.
    config = make_config(
        {"audit": {"type": "file", "path": "audit.jsonl"}},
        {"shop": {"path": "/hooks/shop", "targets": ["audit"], "silent_after": "1h"}},
        alerts={"target": "audit"},
    )
    clock = FakeClock(T0)
    a = PostgresStore(pg_url, instance_id="a")
    b = PostgresStore(pg_url, instance_id="b")
    await a.open()
    await b.open()
    said: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
    leader = {"a": True, "b": False}
    watches = {
        name: SilenceWatch(
            store, config, clock, said[name].extend, leading=functools.partial(leader.get, name)
        )
        for name, store in (("a", a), ("b", b))
    }
    try:
        shop = event()._replace(route="shop")
        await a.accept_event(shop._replace(received_at=T0), [NewDelivery("audit")], T0)
        await b.accept_event(shop._replace(received_at=T0 + 60), [NewDelivery("audit")], T0)
        clock.set(T0 + 3600 + 61)
        # b follows: its loop runs (on a clock of its own) and judges nothing.
        follower = SilenceWatch(
            b,
            config,
            FakeClock(T0 + 7200),
            said["b"].extend,
            leading=functools.partial(leader.get, "b"),
        )
        running = asyncio.create_task(follower.run())
        await asyncio.sleep(0.05)
        follower.stop()
        await running
        assert (await a.route_watches()).routes == {}
        await watches["a"].run_once()
        assert [(n["kind"], n["route"]) for n in said["a"]] == [("silent", "shop")]
        watch = (await b.route_watches()).routes["shop"]
        assert (watch.last_event_at, watch.silent_since) == (T0 + 60, T0 + 3661)

        leader.update(a=False, b=True)  # a is gone; b leads
        clock.advance(600)
        await watches["b"].run_once()
        assert said["b"] == []  # said already
        await a.accept_event(shop._replace(received_at=clock.now()), [NewDelivery("audit")], T0)
        await watches["b"].run_once()
        assert said["b"] == [{"kind": "back", "route": "shop", "silent_seconds": 4201.0}]
    finally:
        await a.close()
        await b.close()
