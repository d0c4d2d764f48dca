"""relay gives memory back once quiet (relay.background.memory): SQLite's page caches,
read from SQLite's own count of the memory it holds (sqlite3_memory_used,
in the library Python's sqlite3 module runs on)."""

from __future__ import annotations

import _sqlite3
import asyncio
import ctypes
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relay.background.memory import MemoryRelease
from relay.store import SqliteStore

from helpers import Timeline, eventually
from samples import T0, TWO, event

_memory_used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
_memory_used.restype = ctypes.c_int64

MIB = 1 << 20


def sqlite_memory() -> int:
    return int(_memory_used())


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    yield store
    await store.close()


async def busy(store: SqliteStore, events: range) -> None:
    """A burst: the writer's cache and the readers' fill with its pages."""
    body = b'{"order": "%d", "note": "' + b"x" * 1000 + b'"}'
    for start in range(events.start, events.stop, 500):
        await asyncio.gather(
            *(
                store.accept_event(event(f"k{n}", body=body % n), TWO, T0)
                for n in range(start, start + 500)
            )
        )
    for event_id in range(events.start + 1, events.stop, 7):
        await store.get_event(event_id)
    await store.stats()


async def released(release: MemoryRelease, times: int) -> bool:
    return release.releases == times


async def test_caches_are_given_back_once_quiet_and_once_a_spell(store: SqliteStore) -> None:
    await busy(store, range(0, 3000))
    full = sqlite_memory()
    work = itertools.count()
    activity = 0.0
    timeline = Timeline()  # the release's time; the store's work is real
    release = MemoryRelease(
        store,
        lambda: activity,
        quiet=0.2,
        every=0.02,
        monotonic=timeline.monotonic,
        wait=timeline.wait,
    )
    running = asyncio.create_task(release.run())
    try:
        # While relay works, nothing is given back, however long it lasts.
        for _ in range(30):
            activity = next(work)
            await timeline.advance(0.02)
        assert release.releases == 0
        assert sqlite_memory() >= full - MIB // 4
        # Quiet: the caches go, once.
        await timeline.advance(0.25)
        await eventually(lambda: released(release, 1))
        assert sqlite_memory() < full - 2 * MIB, (full, sqlite_memory())
        await timeline.advance(0.5)
        assert release.releases == 1
        # Work again, then quiet again: given back again, and the store
        # still answers from the file.
        await busy(store, range(3000, 4000))
        activity = next(work)
        await timeline.advance(0.05)
        assert release.releases == 1  # not quiet yet
        await timeline.advance(0.25)
        await eventually(lambda: released(release, 2))
        assert await store.get_event(4000) is not None
    finally:
        release.stop()
        await running


async def test_the_writers_prepared_statements_are_given_back(tmp_path: Path) -> None:
    # Each batch size the writer saw keeps its INSERT prepared (relay.store.sqlite.accept):
    # batches of 1 to 40 events leave ~3 MiB of statements, more than the pages.
    before = sqlite_memory()
    store = SqliteStore(tmp_path / "relay.db")
    await store.open()
    try:
        opened = sqlite_memory() - before
        numbers = itertools.count()
        for size in range(1, 41):  # one loop turn each: one batch of `size`
            keys = [f"k{next(numbers)}" for _ in range(size)]
            await asyncio.gather(*(store.accept_event(event(key), TWO, T0) for key in keys))
        assert sqlite_memory() - before > opened + 2 * MIB
        await store.release_memory()
        assert sqlite_memory() - before <= opened, (opened, sqlite_memory() - before)
        # Prepared again when next needed: the store goes on as before.
        await asyncio.gather(*(store.accept_event(event(f"again{n}"), TWO, T0) for n in range(40)))
        assert await store.get_event(860) is not None
    finally:
        await store.close()
