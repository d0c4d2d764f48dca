"""The SQLite store: one file in WAL mode, one process (store.py composes it)."""

from relay.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
