"""Copy a SQLite database into an empty PostgreSQL one, ids and history kept.

One PostgreSQL transaction for the whole copy: a failure half-way leaves the
destination as empty as it was. Rows go in with COPY, a bounded batch at a
time from SQLite. Each table's row count is compared at the end, inside the
transaction, so a copy that does not match is never committed. The id
sequences start after the highest id ever given on SQLite (purged ones
included): an event id names one event forever.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from relay.core.pgurl import masked_url
from relay.store.base import StoreError
from relay.store.migrations import LATEST as SQLITE_LATEST
from relay.store.postgres.errors import DRIVER_ERRORS, at
from relay.store.postgres.schema import migrate

BATCH = 5000


def _bytes(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    # How a SQLite value becomes the PostgreSQL one, by column.
    convert: dict[str, Callable[[Any], Any]]
    sequence: bool = True  # an identity id whose sequence must follow


TABLES = (
    Table(
        "events",
        (
            "id",
            "route",
            "idempotency_key",
            "received_at",
            "remote_addr",
            "method",
            "path",
            "query",
            "headers",
            "content_type",
            "body",
            "digest",
            "key_variant",
            "conflict_of",
        ),
        {"headers": _bytes, "body": _bytes, "digest": _bytes},
    ),
    Table(
        "deliveries",
        (
            "id",
            "event_id",
            "route",
            "target",
            "status",
            "attempts",
            "cycle_attempts",
            "next_attempt_at",
            "lease_until",
            "last_error",
            "updated_at",
            "resume_status",
            "resume_at",
            "order_key",
            "message_tag",
            "seen_successes",
            "fails_alone",
            "resolves",
            "resolved_by",
        ),
        {"fails_alone": bool},
    ),
    Table(
        "attempts",
        (
            "id",
            "delivery_id",
            "number",
            "started_at",
            "duration",
            "outcome",
            "http_status",
            "error",
            "response",
            "next_attempt_at",
            "kind",
            "cycle_number",
            "request",
            "request_body",
        ),
        {"response": _bytes, "request_body": _bytes},
    ),
    Table("delivery_log", ("id", "delivery_id", "at", "kind", "detail", "by"), {}),
    Table("audit", ("id", "at", "by", "action", "subject", "count", "deliveries"), {}),
    Table(
        "targets",
        (
            "name",
            "paused",
            "paused_at",
            "last_success_at",
            "last_error_at",
            "last_error",
            "consecutive_failures",
            "down_streak",
            "down_since",
            "probe_at",
            "probes",
            "successes",
            "probe_delivery",
        ),
        {"paused": bool},
        sequence=False,
    ),
    Table(
        "rejections",
        ("id", "route", "at", "remote_addr", "reason", "detail", "headers"),
        {"headers": _bytes},
    ),
    Table("resends", ("copy_id", "original_id", "at", "by"), {}, sequence=False),
)


@dataclass(frozen=True)
class Copied:
    counts: dict[str, int]


def _rows(source: sqlite3.Connection, table: Table) -> Iterator[list[tuple[Any, ...]]]:
    converters = [table.convert.get(column) for column in table.columns]
    cursor = source.execute(f"SELECT {', '.join(table.columns)} FROM {table.name}")
    while batch := cursor.fetchmany(BATCH):
        yield [
            tuple(
                convert(value) if convert is not None and value is not None else value
                for convert, value in zip(converters, row, strict=True)
            )
            for row in batch
        ]


def open_source(path: Path) -> sqlite3.Connection:
    """The SQLite database, read only, at the schema this relay knows."""
    if not path.exists():
        raise StoreError(f"no database at {path}")
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    version = source.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]
    if version != SQLITE_LATEST:
        source.close()
        raise StoreError(
            f"{path} is at schema version {version}, this relay writes {SQLITE_LATEST}:"
            " start and stop this relay's `relay serve` on it once to upgrade it first"
        )
    return source


async def copy_into(source: sqlite3.Connection, url: str) -> Copied:
    """Copy every table; raises StoreError, leaving the destination untouched,
    if it already holds events or a count does not match."""
    try:
        return await _copy(source, url)
    except (*DRIVER_ERRORS, StoreError) as error:
        raise at(f"--to {masked_url(url)}", error) from None


async def connect_destination(url: str) -> asyncpg.Connection:
    """The copy's connection, committing synchronously: where the role or the
    database has synchronous_commit off, its last commit could still be lost
    when migrate-store says the copy is done (relay serve's pool does the same)."""
    connection = await asyncpg.connect(url, timeout=30)
    try:
        if await connection.fetchval("SHOW synchronous_commit") == "off":
            await connection.execute("SET synchronous_commit = on")
    except BaseException:
        connection.terminate()
        raise
    return connection


async def _copy(source: sqlite3.Connection, url: str) -> Copied:
    connection = await connect_destination(url)
    try:
        await migrate(connection)
        async with connection.transaction():
            if await connection.fetchval("SELECT EXISTS (SELECT 1 FROM events)"):
                raise StoreError(
                    "the PostgreSQL database already holds events: copy into an empty one"
                )
            await connection.execute("DELETE FROM targets")  # state rows only, no events yet
            counts: dict[str, int] = {}
            for table in TABLES:
                for batch in _rows(source, table):
                    await connection.copy_records_to_table(
                        table.name, records=batch, columns=list(table.columns)
                    )
                copied = int(await connection.fetchval(f"SELECT COUNT(*) FROM {table.name}"))
                expected = int(source.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()[0])
                if copied != expected:
                    raise StoreError(
                        f"{table.name}: {copied} rows copied, {expected} in SQLite: nothing kept"
                    )
                counts[table.name] = copied
            await _search(connection, source)
            await _sequences(connection, source)
        return Copied(counts)
    finally:
        await connection.close()


async def _search(connection: asyncpg.Connection[Any], source: sqlite3.Connection) -> None:
    """The search index as built so far; the indexer goes on from its mark."""
    for batch in _batches(source, "SELECT rowid, text, digits FROM event_search"):
        await connection.copy_records_to_table(
            "event_search", records=batch, columns=["event_id", "text", "digits"]
        )
    through = source.execute("SELECT indexed_through FROM search_progress WHERE id = 1").fetchone()
    await connection.execute(
        "UPDATE search_progress SET indexed_through = $1 WHERE id = 1", int(through[0] or 0)
    )


def _batches(source: sqlite3.Connection, sql: str) -> Iterator[list[tuple[Any, ...]]]:
    cursor = source.execute(sql)
    while batch := cursor.fetchmany(BATCH):
        yield [tuple(row) for row in batch]


async def _sequences(connection: asyncpg.Connection[Any], source: sqlite3.Connection) -> None:
    high = dict(source.execute("SELECT name, last_id FROM id_high_water").fetchall())
    for table in TABLES:
        if not table.sequence:
            continue
        largest = source.execute(f"SELECT MAX(id) FROM {table.name}").fetchone()[0] or 0
        last = max(int(largest), int(high.get(table.name, 0)))
        if last:
            await connection.execute(
                "SELECT setval(pg_get_serial_sequence($1, 'id'), $2)", table.name, last
            )
