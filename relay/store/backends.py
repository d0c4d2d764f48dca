"""Which store a config names: PostgreSQL for a `url`, else the SQLite file.

Each backend's driver is imported only when the config names it, so an
operator command on a SQLite database never pays for asyncpg.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from relay.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from relay.config.model import StorageConfig
    from relay.store.postgres import PostgresStore


def open_store(storage: StorageConfig) -> SqliteStore | PostgresStore:
    """The backend the config names: PostgreSQL for a `url`, else the SQLite file."""
    if storage.url is not None:
        from relay.store.postgres import PostgresStore

        return PostgresStore(
            storage.url,
            # A request waits at most this long for a place in a commit before 503.
            write_queue_timeout=storage.busy_timeout + 1.0,
            command_timeout=storage.busy_timeout + 5.0,
        )
    return SqliteStore(
        storage.path,
        synchronous=storage.synchronous,
        busy_timeout=storage.busy_timeout,
        # A request waits at most this long for a place in a commit before 503.
        write_queue_timeout=storage.busy_timeout + 1.0,
    )


def lock_path(database: Path) -> Path:
    """The lock beside the database file itself: a symlink to the same database
    under another name must meet the same lock, or two daemons would share it."""
    database = database.resolve()
    return database.with_name(database.name + ".lock")
