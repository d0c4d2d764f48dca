"""Search by content over real HTTP and a real SQLite file: the API, the CLI, the index's life.

The index is filled by the background indexer, never by ingress: these tests
drive it with `catch_up()` (the way the scheduler is driven with `drain()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay.app import Relay
from relay.background import retention
from relay.background.indexer import (
    CHUNK,
    FLOOD_DEFER,
    MAX_DEFER,
    QUIET,
    SETTLE,
    SearchIndexer,
)
from relay.core.clock import FakeClock
from relay.core.payload import Payload
from relay.core.secrets import Masker
from relay.ops.search import documents
from relay.store import NewDelivery, NewEvent, SearchDocument, SqliteStore, Status

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import arelay_cli, eventually, write_config

TOKEN = "admin-token-0123456789"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

# Tilda posts application/x-www-form-urlencoded with the fields Name, Email,
# Phone, plus tranid and formid (https://exceltic.dev/en/kommo-tilda-forma-v-sdelku/).
LEADS = [
    "Name=%D0%98%D0%B2%D0%B0%D0%BD&Phone=%2B7+%28999%29+123-45-67&tranid=1:1&formid=f1",
    "Name=Maria&Phone=89991234567&tranid=1:2&formid=f1",
    "Name=Anna&Phone=79991234567&tranid=1:3&formid=f1",
    "Name=Oleg&Phone=89990000000&tranid=1:4&formid=f1",
]


def routes(shop_targets: list[str]) -> dict[str, Any]:
    return {
        "tilda": {"path": "/hooks/tilda", "targets": ["crm"]},
        "shop": {"path": "/hooks/shop", "targets": shop_targets},
    }


async def post(relay: Relay, http: aiohttp.ClientSession, path: str, body: str, **kw: Any) -> str:
    async with http.post(relay.ingress_url + path, data=body.encode(), **kw) as response:
        assert response.status == 200, await response.text()
        event_id: str = (await response.json())["id"]
        return event_id


async def search(
    relay: Relay, http: aiohttp.ClientSession, expect: int = 200, **params: str
) -> Any:
    async with http.get(
        relay.admin_url + "/api/v1/events",
        params=params,
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as response:
        assert response.status == expect, await response.text()
        return await response.json()


def ids(page: Any) -> list[str]:
    return [event["id"] for event in page["events"]]


@pytest.fixture
async def relay(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> Relay:
    _, crm_url = await start_sink([200])
    _, erp_url = await start_sink([422])  # refuses everything: dead at once
    config = make_config(
        {
            "crm": {"type": "http", "url": crm_url},
            "erp": {"type": "http", "url": erp_url, "retry": {"retries": 0}},
        },
        routes(["crm", "erp"]),
        admin={"token": TOKEN},
    )
    return await start_relay(config, background=False, clock=FakeClock())


async def test_a_phone_in_any_spelling_finds_every_lead_newest_first(
    relay: Relay, http: aiohttp.ClientSession
) -> None:
    lead_ids = [await post(relay, http, "/hooks/tilda", body, headers=FORM) for body in LEADS]
    await relay.indexer.catch_up()
    for query in ("+7 (999) 123-45-67", "89991234567", "79991234567", "9991234567"):
        page = await search(relay, http, q=query)
        assert ids(page) == list(reversed(lead_ids[:3])), query
        assert page["search"]["not_indexed"] == 0
    found = await search(relay, http, q="ИВАН")
    assert ids(found) == [lead_ids[0]]
    # A hit says whom it is about, and where it matched (it said nothing of either).
    [hit] = found["events"]
    assert hit["who"] == [["name", "Иван"], ["phone", "+7 (999) 123-45-67"]]
    assert hit["snippet"] == "Иван"
    by_phone = await search(relay, http, q="8 999 000 00 00")
    assert ids(by_phone) == [lead_ids[3]]
    assert by_phone["events"][0]["snippet"] == "89990000000"
    assert ids(await search(relay, http, q="nobody-here")) == []
    problem = await search(relay, http, 400, q="ab")
    assert problem["error"].startswith("q: search text needs a word of at least 3 characters")


async def test_search_combines_with_filters_and_pages(
    relay: Relay, http: aiohttp.ClientSession
) -> None:
    shop = [
        await post(relay, http, "/hooks/shop", f'{{"order": {i}, "email": "buyer@example.com"}}')
        for i in range(5)
    ]
    tilda = await post(relay, http, "/hooks/tilda", "Email=buyer%40example.com", headers=FORM)
    await relay.scheduler.drain()  # erp refuses: the shop's events are dead there
    await relay.indexer.catch_up()

    everything = await search(relay, http, q="buyer@example.com")
    assert ids(everything) == [tilda, *reversed(shop)]
    assert ids(await search(relay, http, q="buyer@example.com", route="tilda")) == [tilda]
    dead = await search(relay, http, q="buyer@example.com", status="dead", target="erp")
    assert ids(dead) == list(reversed(shop))

    first = await search(relay, http, q="buyer@example.com", limit="4")
    assert ids(first) == [tilda, *reversed(shop)][:4]
    second = await search(
        relay, http, q="buyer@example.com", limit="4", cursor=first["next_cursor"]
    )
    assert ids(second) == [shop[1], shop[0]]
    assert second["next_cursor"] is None


async def test_ingress_never_waits_for_the_index_and_a_search_says_how_far_it_got(
    relay: Relay, http: aiohttp.ClientSession
) -> None:
    first = await post(relay, http, "/hooks/tilda", LEADS[0], headers=FORM)
    await relay.indexer.catch_up()
    # Stored and acknowledged, but the indexer has not run: not searchable yet, and said so.
    second = await post(relay, http, "/hooks/tilda", LEADS[1], headers=FORM)
    page = await search(relay, http, q="89991234567")
    assert ids(page) == [first]
    assert page["search"]["indexed_through"] == first
    assert page["search"]["not_indexed"] == 1
    # Ids as ids, the count as a count (not "after #10915 (up to 2628)").
    assert page["search"]["note"].startswith(
        f"events after #{first}, up to #{second} (at most 1 event) are not indexed yet"
    )
    await relay.indexer.catch_up()
    assert ids(await search(relay, http, q="89991234567")) == [second, first]


def lead(i: int) -> NewEvent:
    """A Tilda lead as stored by ingress: number i, its own phone."""
    return NewEvent(
        route="tilda",
        idempotency_key=None,
        received_at=1_800_000_000.0 + i,
        remote_addr=None,
        payload=Payload(
            method="POST",
            path="/hooks/tilda",
            query="",
            headers=[("Content-Type", FORM["Content-Type"])],
            content_type=FORM["Content-Type"],
            body=f"Name=Lead{i}&Phone=8999{i:07d}".encode(),
        ),
    )


async def store_leads(store: SqliteStore, count: int) -> None:
    """Leads 0 to count - 1 stored as ingress stores them, their delivery skipped."""
    for i in range(count):
        await store.accept_event(lead(i), [NewDelivery("crm", Status.SKIPPED)], 1_800_000_000.0)


async def test_index_catches_up_after_a_crash_and_purge_removes_from_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "relay.db"
    store = SqliteStore(path)
    await store.open()

    await store_leads(store, 10)
    indexer = SearchIndexer(store, FakeClock(), Masker(), batch=4)
    assert await indexer.step() == 4
    await store.close()  # "crash" between batches: the mark says where it stopped

    store = SqliteStore(path)
    await store.open()
    progress = await store.search_progress()
    assert (progress.indexed_through, progress.behind) == (4, 6)
    indexer = SearchIndexer(store, FakeClock(), Masker(), batch=4)
    assert await indexer.catch_up() == 6
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM event_search").fetchone()[0] == 10

    # Purge takes the finished events older than the cutoff, and their index rows.
    removed = await retention.purge(store, 1.0, {}, 1_800_000_000.0 + 6)
    assert removed == 5
    remaining = [row[0] for row in db.execute("SELECT rowid FROM event_search ORDER BY rowid")]
    assert remaining == [6, 7, 8, 9, 10]
    await store.close()
    db.close()


async def test_a_batch_is_indexed_a_piece_at_a_time_each_with_its_mark(tmp_path: Path) -> None:
    # Each piece holds up a webhook that arrives meanwhile (the text holds the
    # GIL, the write holds the writer): a backlog after a restart must not go
    # in one 60-120 ms batch. Pieces of CHUNK events, one write each, after
    # the one that says what the indexer is on (relay.background.indexer).
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    await store_leads(store, 2 * CHUNK + 1)
    write_jobs = store.write_stats[1]
    marks: list[int] = []  # each write's high-water mark, as the store is given it
    index_events = store.index_events

    async def recorded(found: Sequence[SearchDocument], through: int) -> None:
        marks.append(through)
        await index_events(found, through)

    store.index_events = recorded  # type: ignore[method-assign]
    indexer = SearchIndexer(store, FakeClock(), Masker())
    assert await indexer.step() == 2 * CHUNK + 1

    assert store.write_stats[1] - write_jobs == 1 + 3
    assert marks == [CHUNK, 2 * CHUNK, 2 * CHUNK + 1]
    assert await store.interrupted_indexing() is None  # on none once through
    assert (await store.search_progress()).indexed_through == 2 * CHUNK + 1
    await store.close()


async def test_the_index_commits_without_an_fsync_of_its_own(tmp_path: Path) -> None:
    # It is made again from the events if a power cut undoes it; its fsync
    # only held up a webhook committing next. Beside a job that needs no
    # fsync either, the batch commits at synchronous NORMAL (1), not FULL (2).
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    await store_leads(store, 2)
    batch = await store.events_to_index(10, 1000)

    def level(connection: sqlite3.Connection) -> int:
        found: int = connection.execute("PRAGMA synchronous").fetchone()[0]
        return found

    try:
        _, seen = await asyncio.gather(
            store.index_events(documents(batch, Masker()), batch[-1].event_id),
            store._writer.run(level, durable=False),
        )
        assert seen == 1
        assert (await store.search_progress()).indexed_through == batch[-1].event_id
    finally:
        await store.close()


async def test_an_event_purged_while_being_indexed_stays_out_of_the_index(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    event = NewEvent("tilda", None, 1.0, None, Payload("POST", "/", "", [], None, b"Name=Gone"))
    accepted = await store.accept_event(event, [NewDelivery("crm", Status.SKIPPED)], 1.0)
    batch = await store.events_to_index(10, 1000)
    await retention.purge(store, 1.0, {}, 10.0)
    await store.index_events(documents(batch, Masker()), accepted.event_id)
    with sqlite3.connect(tmp_path / "relay.db") as db:
        assert db.execute("SELECT COUNT(*) FROM event_search").fetchone()[0] == 0
    assert (await store.search_progress()).indexed_through == accepted.event_id
    await store.close()


async def test_cli_search_finds_the_lead_and_notes_what_is_not_indexed(
    relay: Relay, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    lead = await post(relay, http, "/hooks/tilda", LEADS[0], headers=FORM)
    await relay.indexer.catch_up()
    late = await post(relay, http, "/hooks/tilda", LEADS[1], headers=FORM)
    config = write_config(
        tmp_path / "cli.toml",
        {
            "storage": {"path": str(relay.config.storage.path)},
            "targets": {"crm": {"type": "file", "path": str(tmp_path / "x.jsonl")}},
            "routes": routes(["crm"]),
        },
    )
    result = await arelay_cli("events", "--config", str(config), "--search", "8 999 123-45-67")
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "RECEIVED", "ROUTE"]
    assert lines[0].split()[-3:] == ["WHO", "DELIVERIES", "MATCH"]
    assert [line.split()[0] for line in lines[1:]] == [lead]
    assert "Иван, +7 (999) 123-45-67" in lines[1]
    assert f"events after #{lead}, up to #{late} (at most 1 event) are not indexed yet" in (
        result.stderr
    )
    await relay.indexer.catch_up()
    found = await arelay_cli(
        "events", "--config", str(config), "--search", "+7 999 1234567", "--json"
    )
    assert '"id": "' + late + '"' in found.stdout
    refused = await arelay_cli("events", "--config", str(config), "--search", "7", check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "relay: --search: search text needs a word of at least 3 characters"
        " (shorter ones would match nearly everything)"
    )


async def test_a_running_relay_indexes_by_itself(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    config = make_config(
        {"crm": {"type": "file", "path": "crm.jsonl"}},
        routes(["crm"]),
        admin={"token": TOKEN},
    )
    relay = await start_relay(config, poll_interval=0.05)  # background tasks run
    lead = await post(relay, http, "/hooks/tilda", LEADS[1], headers=FORM)

    async def found() -> bool:
        return ids(await search(relay, http, q="+7 999 123 45 67")) == [lead]

    await eventually(found, timeout=15.0)
    assert relay.indexer.indexed >= 1


async def flood(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    http: aiohttp.ClientSession,
    seconds: float,
) -> tuple[Relay, int, list[int]]:
    """A relay with its background tasks, sent Tilda leads one after another
    (no gap near indexer.QUIET) for `seconds`: the relay, how many were
    posted, and the size of each step the indexer took meanwhile."""
    config = make_config(
        {"crm": {"type": "file", "path": "crm.jsonl"}}, routes(["crm"]), admin={"token": TOKEN}
    )
    relay = await start_relay(config, poll_interval=0.05)
    posted, steps = await post_leads(relay, http, seconds)
    return relay, posted, steps


async def post_leads(
    relay: Relay, http: aiohttp.ClientSession, seconds: float
) -> tuple[int, list[int]]:
    """Tilda leads posted one after another for `seconds`: how many, and the
    size of each step the indexer took meanwhile."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + seconds
    posted = 0
    steps: list[int] = []
    while loop.time() < ends:
        form = f"Name=Lead{posted}&Phone=8999{posted:07d}&tranid=9:{posted}&formid=f1"
        before = relay.indexer.indexed
        await post(relay, http, "/hooks/tilda", form, headers=FORM)
        posted += 1
        if relay.indexer.indexed != before:
            steps.append(relay.indexer.indexed - before)
    return posted, steps


async def test_the_index_waits_while_webhooks_arrive_and_follows_soon_after(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # The indexer gives the writer to ingest while webhooks keep coming (gaps
    # under indexer.QUIET) and indexes within a moment once they stop, rather
    # than at its next idle look (IDLE_INTERVAL, 5 s). Ingress must tell it of
    # each arrival: without that it indexed in the middle of a flood, taking
    # ~10 µs of CPU per webhook from ingest (found profiling bench/ingest.py).
    relay, posted, _ = await flood(make_config, start_relay, http, 0.75)
    # Only slices amid the flood (see the next test), never all of it.
    assert relay.indexer.indexed < posted

    async def all_indexed() -> bool:
        return relay.indexer.indexed == posted

    await eventually(all_indexed, timeout=2.0)


async def test_a_catch_up_gives_way_to_a_webhook_after_the_piece_under_way(
    tmp_path: Path,
) -> None:
    # After a restart with a backlog the indexer works without a pause; a
    # webhook that comes meanwhile must not share the writer and the GIL with
    # it piece after piece: the batch stops after the piece under way.
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    await store_leads(store, 10 * CHUNK)
    indexer = SearchIndexer(store, FakeClock(), Masker())
    step = asyncio.create_task(indexer.step(give_way=True))
    while True:  # every loop turn: the first piece's end, before the second's
        if indexer.indexed >= CHUNK:
            break
        await asyncio.sleep(0)
    indexer.noticed()  # what ingress calls for each webhook stored
    stopped_after = await step
    assert CHUNK <= stopped_after <= 2 * CHUNK
    assert await indexer.catch_up() == 10 * CHUNK - stopped_after  # the rest, later
    await store.close()


async def test_a_catch_up_that_gave_way_to_webhooks_still_finishes(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # A backlog at start, webhooks amid its catch-up (it gives way to them,
    # then takes a piece every MAX_DEFER or, amid a flood, less often): once
    # they stop, it finishes.
    config = make_config(
        {"crm": {"type": "file", "path": "crm.jsonl"}}, routes(["crm"]), admin={"token": TOKEN}
    )
    backlog = 300
    store = SqliteStore(config.storage.path)
    await store.open()
    await store_leads(store, backlog)
    await store.close()
    relay = await start_relay(config, poll_interval=0.05)

    async def started() -> bool:
        return relay.indexer.indexed > 0

    await eventually(started, timeout=5.0)
    posted, _ = await post_leads(relay, http, 3 * MAX_DEFER)
    assert relay.indexer.indexed < backlog  # the webhooks came amid the catch-up

    async def all_indexed() -> bool:
        return relay.indexer.indexed == backlog + posted

    await eventually(all_indexed, timeout=10.0)


async def test_amid_a_flood_the_index_follows_in_small_slices(
    make_config: ConfigFactory, start_relay: RelayFactory, http: aiohttp.ClientSession
) -> None:
    # Held back for good, the index would fall ever further behind; in one
    # large batch it stalls every sender at once (a batch of 200 was 60-120
    # ms of text and writing, slices of 20 ~7 ms). So a flood gets pieces of
    # CHUNK events, at most one every FLOOD_DEFER (the next test). The first
    # comes SETTLE after the first webhook wakes the indexer, and later on a
    # loaded machine: long enough for two more.
    _, posted, steps = await flood(make_config, start_relay, http, SETTLE + 2 * FLOOD_DEFER)
    assert posted > 4 * CHUNK  # a flood: the pieces could not cover it
    assert steps, "nothing indexed during the flood"
    assert max(steps) <= CHUNK


@contextlib.asynccontextmanager
async def running_indexer(
    tmp_path: Path, backlog: int, **options: Any
) -> AsyncIterator[tuple[SqliteStore, SearchIndexer]]:
    """A store holding `backlog` leads and an indexer running on it (with
    SearchIndexer's `options`), stopped after."""
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    await store_leads(store, backlog)
    indexer = SearchIndexer(store, FakeClock(), Masker(), **options)
    running = asyncio.create_task(indexer.run())
    try:
        yield store, indexer
    finally:
        indexer.stop()
        await running
        await store.close()


async def test_an_instance_that_does_not_lead_the_cluster_indexes_nothing_until_it_does(
    tmp_path: Path,
) -> None:
    # On a cluster only the leading instance indexes (the others would race
    # it over the same events), and one that takes the lead goes on at once.
    # tests/e2e/test_postgres_cluster.py runs three.
    leads = False
    async with running_indexer(tmp_path, 10, leading=lambda: leads) as (_, indexer):
        for _ in range(5):
            indexer.noticed()  # webhooks this instance took
            await asyncio.sleep(2 * QUIET)
        assert indexer.indexed == 0
        leads = True
        indexer.lead_taken()

        async def all_indexed() -> bool:
            return indexer.indexed == 10

        await eventually(all_indexed, timeout=5.0)


async def test_without_a_writer_shared_with_ingest_the_index_keeps_pace_amid_webhooks(
    tmp_path: Path,
) -> None:
    # On PostgreSQL the index has connections of its own, so it need not wait
    # for a pause in webhooks, which under steady load never comes.
    async with running_indexer(tmp_path, 100, one_writer=False) as (_, indexer):
        for _ in range(100):  # webhooks never pause for QUIET
            indexer.noticed()
            await asyncio.sleep(QUIET / 5)
            if indexer.indexed == 100:
                break
        assert indexer.indexed == 100


@contextlib.asynccontextmanager
async def unwritable_index(
    tmp_path: Path, clock: FakeClock, **options: Any
) -> AsyncIterator[tuple[SearchIndexer, sqlite3.Connection]]:
    """An indexer running over 5 leads while another connection holds the
    file (its ROLLBACK frees it): the index cannot be written until then."""
    store = SqliteStore(tmp_path / "relay.db", busy_timeout=0.05)
    await store.open()
    await store_leads(store, 5)
    indexer = SearchIndexer(store, clock, Masker(), retry_after_error=0.01, **options)
    other = sqlite3.connect(tmp_path / "relay.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    running = asyncio.create_task(indexer.run())
    try:
        yield indexer, other
    finally:
        indexer.stop()
        await running
        other.close()
        await store.close()


def said(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


async def test_an_index_that_cannot_be_written_says_so_once_a_minute_and_once_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # While the database is away the index fails every few seconds: a line
    # each time wrote 14 warnings in 70 s beside the scheduler's 3 (issue 40).
    clock = FakeClock()
    async with unwritable_index(tmp_path, clock) as (indexer, other):

        async def said_times(text: str, times: int) -> bool:
            return said(caplog, text) == times

        async def all_indexed() -> bool:
            return indexer.indexed == 5

        await eventually(lambda: said_times("search indexing failed", 1))
        await asyncio.sleep(0.3)  # it keeps trying, and says nothing more
        assert said(caplog, "search indexing failed") == 1
        clock.advance(61)
        await eventually(lambda: said_times("search indexing failed", 2))
        other.execute("ROLLBACK")
        await eventually(all_indexed)
        assert said(caplog, "search indexing works again, after 1m") == 1
        assert said(caplog, "search indexing failed") == 2


async def test_an_instance_that_lost_the_lead_while_its_index_failed_does_not_say_it_works_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A database restart: the leader's index fails, the lead moves on, and
    # later it leads again. "works again" would tell of a failure it had not
    # had while another instance indexed.
    clock = FakeClock()
    leads = True
    async with unwritable_index(tmp_path, clock, leading=lambda: leads) as (indexer, other):

        async def failed_once() -> bool:
            return said(caplog, "search indexing failed") == 1

        async def all_indexed() -> bool:
            return indexer.indexed == 5

        await eventually(failed_once)
        leads = False
        await asyncio.sleep(0.1)
        other.execute("ROLLBACK")
        clock.advance(26)
        leads = True
        indexer.lead_taken()
        await eventually(all_indexed)
        assert said(caplog, "works again") == 0


async def test_amid_a_fast_flood_a_piece_every_flood_defer(tmp_path: Path) -> None:
    # Each piece holds up the webhook it meets by ~2 ms (its read, its text,
    # its write): one every MAX_DEFER met 0.8 % of a lone sender's ~1,200
    # answers a second, and could not keep pace with them anyway. Here 5,000
    # webhooks a second, as ingress tells of them, amid a backlog, for two
    # FLOOD_DEFERs: a piece every MAX_DEFER would be nearly twice the bound below.
    seconds = SETTLE + 2 * FLOOD_DEFER
    async with running_indexer(tmp_path, 200) as (_, indexer):
        loop = asyncio.get_running_loop()
        ends = loop.time() + seconds
        while loop.time() < ends:
            for _ in range(50):
                indexer.noticed()
            await asyncio.sleep(0.01)
        # One piece at the start (then it gives way), one every FLOOD_DEFER:
        # ~4. Every MAX_DEFER it was ~13 (52 events).
        assert CHUNK <= indexer.indexed <= 2 * CHUNK * (1 + seconds / FLOOD_DEFER)


async def test_webhooks_it_can_keep_pace_with_are_indexed_as_they_come(
    tmp_path: Path,
) -> None:
    # Never a quiet moment (one every 40 ms, under QUIET), but fewer than a
    # piece of CHUNK every MAX_DEFER follows: a piece every MAX_DEFER, and
    # the index keeps pace (every FLOOD_DEFER it would index 8 a second of
    # these 25).
    stored = 0
    async with running_indexer(tmp_path, 0) as (store, indexer):
        loop = asyncio.get_running_loop()
        ends = loop.time() + SETTLE + 3 * FLOOD_DEFER
        while loop.time() < ends:
            await store.accept_event(lead(stored), [NewDelivery("crm", Status.SKIPPED)], 1.0)
            stored += 1
            indexer.noticed()
            await asyncio.sleep(0.04)
        assert indexer.indexed >= stored // 2  # every FLOOD_DEFER: about a third
