"""The two schemas, migrated to their latest versions, have the same tables and
columns, beyond what each keeps for itself (relay.store.postgres.copy's
SQLITE_ONLY and POSTGRES_ONLY): a column a migration adds to one backend
only fails here, before `relay migrate-store` refuses to copy it. Runs in
the default suite wherever PostgreSQL's binaries are (the contract's
database, conftest.ContractDatabase, is migrated already)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from relay.store.base import StoreError
from relay.store.migrations import migrate
from relay.store.postgres.copy import (
    Columns,
    differences,
    postgres_columns,
    sqlite_columns,
    tables,
)

from conftest import ContractDatabase


def _sqlite(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    migrate(connection)
    return connection


async def _postgres(database: ContractDatabase) -> Columns:
    connection = await asyncpg.connect(database.url)
    try:
        return await postgres_columns(connection)
    finally:
        await connection.close()


async def test_both_schemas_have_the_same_tables_and_columns(
    tmp_path: Path, pg_contract: ContractDatabase
) -> None:
    sqlite = sqlite_columns(_sqlite(tmp_path / "relay.db"))
    postgres = await _postgres(pg_contract)
    assert differences(sqlite, postgres) == []
    # What the copy takes, read from them: every table of relay's data.
    copied = {table.name for table in tables(sqlite, postgres)}
    assert {"events", "deliveries", "attempts", "targets", "audit"} <= copied
    assert "heartbeat" not in copied
    assert "instances" not in copied


async def test_a_column_on_one_backend_only_is_a_difference(
    tmp_path: Path, pg_contract: ContractDatabase
) -> None:
    connection = _sqlite(tmp_path / "relay.db")
    connection.execute("ALTER TABLE deliveries ADD COLUMN identity TEXT")
    sqlite = sqlite_columns(connection)
    postgres = await _postgres(pg_contract)
    assert differences(sqlite, postgres) == ["column deliveries.identity is on SQLite only"]
    with pytest.raises(StoreError, match=r"deliveries\.identity is on SQLite only"):
        tables(sqlite, postgres)
    del postgres["targets"]["probes"]
    postgres["events"]["digest"] = "text"
    assert differences(sqlite_columns(_sqlite(tmp_path / "other.db")), postgres) == [
        "column events.digest is BLOB on SQLite, text on PostgreSQL",
        "column targets.probes is on SQLite only",
    ]


def test_what_each_keeps_for_itself_is_no_difference() -> None:
    sqlite: Columns = {
        "deliveries": {"id": "INTEGER", "paused": "INTEGER"},
        "heartbeat": {"id": "INTEGER"},
    }
    postgres: Columns = {
        "deliveries": {"id": "bigint", "paused": "boolean", "lease_owner": "text"},
        "pacing": {"name": "text"},
    }
    assert differences(sqlite, postgres) == []
    postgres["extra"] = {"id": "bigint"}
    assert differences(sqlite, postgres) == ["table extra is on PostgreSQL only"]
