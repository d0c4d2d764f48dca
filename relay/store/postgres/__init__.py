"""The PostgreSQL store: many instances, one database (store.py composes it).

Importing it loads asyncpg: relay.store.backends imports it only when a
config asks for PostgreSQL."""

from relay.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
