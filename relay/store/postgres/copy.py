"""Copy a SQLite database into an empty PostgreSQL one, ids and history kept.

One PostgreSQL transaction for the whole copy: a failure half-way leaves the
destination as empty as it was. Rows go in with COPY, a bounded batch at a
time from SQLite. Each table's row count is compared at the end, inside the
transaction, so a copy that does not match is never committed. The id
sequences start after the highest id ever given on SQLite (purged ones
included): an event id names one event forever.

What is copied is read from the two schemas themselves, migrated to their
latest versions: every table and column they share, each value converted as
its PostgreSQL column's type asks. A column a migration adds to both is
copied with nothing written here; one added to a single backend makes the
copy refuse (differences), as tests/store/test_schemas.py does.
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

# What one schema has and the other has not, on purpose (tables, and
# table.column): SQLite's readiness heartbeat and the high-water mark of
# purged ids (which the sequences start after, _sequences); what a cluster's
# instances share (PostgreSQL's instances, pacing rows, alert notes, and each
# lease's owner); PostgreSQL's search table, which SQLite's FTS5 index (a
# virtual table) stands for. Any other difference is a migration made for
# one backend only: the copy refuses it.
SQLITE_ONLY = frozenset({"heartbeat", "id_high_water"})
POSTGRES_ONLY = frozenset(
    {
        "instances",
        "pacing",
        "alert_notes",
        "deliveries.lease_owner",
        "deliveries.lease_expires",
        "event_search",
    }
)
# Each schema's own migrations; the search index and its progress, copied
# by _search.
NOT_COPIED = frozenset({"schema_migrations", "search_progress"})

# The kind of value each column type holds (SQLite's affinity; PostgreSQL
# types by the SQLite type they stand for: a BOOLEAN is SQLite's INTEGER).
POSTGRES_KINDS = {
    "bigint": "integer",
    "integer": "integer",
    "smallint": "integer",
    "boolean": "integer",
    "double precision": "real",
    "real": "real",
    "text": "text",
    "bytea": "blob",
}


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# How a SQLite value becomes the PostgreSQL one, by the destination column's
# type (others go as they are).
CONVERT: dict[str, Callable[[Any], Any]] = {"boolean": bool, "bytea": _bytes}

# table -> column -> its type, in the table's order.
Columns = dict[str, dict[str, str]]


def sqlite_columns(source: sqlite3.Connection) -> Columns:
    """The SQLite schema's tables and columns (virtual tables, their shadow
    tables and SQLite's own left out)."""
    tables = source.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    virtual = {name for name, sql in tables if sql.upper().startswith("CREATE VIRTUAL TABLE")}
    # An FTS5 table keeps its index in tables of its own (<name>_data...).
    shadows = {f"{name}_{suffix}" for name in virtual for suffix in _FTS5_SHADOWS}
    return {
        name: {
            column: declared
            for _, column, declared, *_ in source.execute(f"PRAGMA table_info({name})")
        }
        for name, _ in sorted(tables)
        if name not in virtual | shadows
    }


_FTS5_SHADOWS = ("data", "idx", "content", "docsize", "config")


async def postgres_columns(connection: asyncpg.Connection) -> Columns:
    """The PostgreSQL schema's tables and columns."""
    columns: Columns = {}
    for table, column, kind in await connection.fetch(
        "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c"
        " JOIN information_schema.tables t ON t.table_schema = c.table_schema"
        " AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE'"
        " WHERE c.table_schema = current_schema() ORDER BY c.table_name, c.ordinal_position"
    ):
        columns.setdefault(table, {})[column] = kind
    return columns


def kind(sqlite_type: str) -> str:
    """What a SQLite column's declared type holds (its affinity)."""
    declared = sqlite_type.upper()
    if "INT" in declared:
        return "integer"
    if any(text in declared for text in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if "BLOB" in declared or not declared:
        return "blob"
    if any(real in declared for real in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def differences(sqlite: Columns, postgres: Columns) -> list[str]:
    """How the two schemas differ beyond SQLITE_ONLY and POSTGRES_ONLY: a
    table or a column on one side only, or a column of another kind."""
    found = []
    for table in sorted(sqlite.keys() - postgres.keys() - SQLITE_ONLY):
        found.append(f"table {table} is on SQLite only")
    for table in sorted(postgres.keys() - sqlite.keys() - POSTGRES_ONLY):
        found.append(f"table {table} is on PostgreSQL only")
    for table in sorted(sqlite.keys() & postgres.keys()):
        mine, theirs = sqlite[table], postgres[table]
        for column in mine.keys() - theirs.keys():
            if f"{table}.{column}" not in SQLITE_ONLY:
                found.append(f"column {table}.{column} is on SQLite only")
        for column in theirs.keys() - mine.keys():
            if f"{table}.{column}" not in POSTGRES_ONLY:
                found.append(f"column {table}.{column} is on PostgreSQL only")
        for column in mine.keys() & theirs.keys():
            if kind(mine[column]) != POSTGRES_KINDS.get(theirs[column], theirs[column]):
                found.append(
                    f"column {table}.{column} is {mine[column]} on SQLite,"
                    f" {theirs[column]} on PostgreSQL"
                )
    return sorted(found)


@dataclass(frozen=True)
class Table:
    """A table copied as it is: its columns (SQLite's), each with what makes
    its SQLite value the PostgreSQL one."""

    name: str
    columns: tuple[str, ...]
    convert: tuple[Callable[[Any], Any] | None, ...]


def tables(sqlite: Columns, postgres: Columns) -> list[Table]:
    """What the copy copies, read from both schemas; raises StoreError if
    they differ (differences)."""
    found = differences(sqlite, postgres)
    if found:
        raise StoreError(
            "the SQLite and PostgreSQL schemas differ, nothing copied: " + "; ".join(found)
        )
    return [
        Table(
            name,
            tuple(columns),
            tuple(CONVERT.get(postgres[name][column]) for column in columns),
        )
        for name, columns in sqlite.items()
        if name in postgres and name not in NOT_COPIED
    ]


@dataclass(frozen=True)
class Copied:
    counts: dict[str, int]


def _rows(source: sqlite3.Connection, table: Table) -> Iterator[list[tuple[Any, ...]]]:
    cursor = source.execute(f"SELECT {', '.join(table.columns)} FROM {table.name}")
    while batch := cursor.fetchmany(BATCH):
        yield [
            tuple(
                convert(value) if convert is not None and value is not None else value
                for convert, value in zip(table.convert, row, strict=True)
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
            # The silence watch's mark, seeded by the migration: SQLite's comes
            # with its table (the events keep their ids).
            await connection.execute("DELETE FROM rhythm_progress")
            counts: dict[str, int] = {}
            copied_tables = tables(sqlite_columns(source), await postgres_columns(connection))
            for table in copied_tables:
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
            await _sequences(connection, source, [table.name for table in copied_tables])
        return Copied(counts)
    finally:
        await connection.close()


async def _search(connection: asyncpg.Connection[Any], source: sqlite3.Connection) -> None:
    """The search index as built so far; the indexer goes on from its mark."""
    for batch in _batches(source, "SELECT rowid, text, digits FROM event_search"):
        await connection.copy_records_to_table(
            "event_search", records=batch, columns=["event_id", "text", "digits"]
        )
    (through,) = source.execute(
        "SELECT indexed_through FROM search_progress WHERE id = 1"
    ).fetchone()
    await connection.execute(
        "UPDATE search_progress SET indexed_through = $1 WHERE id = 1", int(through or 0)
    )


def _batches(source: sqlite3.Connection, sql: str) -> Iterator[list[tuple[Any, ...]]]:
    cursor = source.execute(sql)
    while batch := cursor.fetchmany(BATCH):
        yield [tuple(row) for row in batch]


async def _sequences(
    connection: asyncpg.Connection[Any], source: sqlite3.Connection, copied: list[str]
) -> None:
    """Each copied table's id sequence starts after the highest id SQLite gave."""
    high = dict(source.execute("SELECT name, last_id FROM id_high_water").fetchall())
    identities = await connection.fetch(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND column_name = 'id' AND is_identity = 'YES' AND table_name = ANY($1::text[])",
        copied,
    )
    for (table,) in identities:
        (largest,) = source.execute(f"SELECT MAX(id) FROM {table}").fetchone()
        last = max(int(largest or 0), int(high.get(table, 0)))
        if last:
            await connection.execute(
                "SELECT setval(pg_get_serial_sequence($1, 'id'), $2)", table, last
            )
