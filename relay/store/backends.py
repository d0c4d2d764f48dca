"""Which store a config asks for, chosen in one place.

A backend is a kind name, how to build its store from the `[storage]`
section, and the lock that keeps `relay serve` processes from sharing a store
that cannot be shared. Adding one is a module with a Store (passing the
contract suite, tests/store/test_contract*.py, unchanged), a line in BACKENDS
and, in `backend_kind`, how a config names it.

    [storage] path = "relay.db"               sqlite      one serve per file (flock)
    [storage] url = "postgresql://..."        postgresql  any number of instances
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.store.base import Store
from relay.store.lock import ProcessLock, ServeLock, lock_path
from relay.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from relay.config import StorageConfig

# lock_path: also for `relay migrate-store`, which must meet a running serve's lock.
__all__ = ["BACKENDS", "Backend", "lock_path", "open_store", "serve_lock"]


@dataclass(frozen=True)
class Backend:
    kind: str
    store: Callable[[StorageConfig], Store]
    lock: Callable[[StorageConfig], ServeLock]


class Shared:
    """No lock: instances share the store by design (each leases what it claims)."""

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass


def _sqlite_store(storage: StorageConfig) -> Store:
    return SqliteStore(
        storage.path,
        synchronous=storage.synchronous,
        busy_timeout=storage.busy_timeout,
        # A request waits at most this long for a place in a commit before 503.
        write_queue_timeout=storage.busy_timeout + 1.0,
    )


def _sqlite_lock(storage: StorageConfig) -> ServeLock:
    return ProcessLock(lock_path(storage.path), database=storage.path)


def _postgres_store(storage: StorageConfig) -> Store:
    from relay.store.postgres import PostgresStore  # asyncpg: only when configured

    assert storage.url is not None
    return PostgresStore(
        storage.url,
        # A request waits at most this long for a place in a commit before 503.
        write_queue_timeout=storage.busy_timeout + 1.0,
        command_timeout=storage.busy_timeout + 5.0,
        instance_id=storage.instance_id,
        dead_after=storage.dead_after,
        max_connections=storage.pool_size,
    )


BACKENDS: dict[str, Backend] = {
    "sqlite": Backend("sqlite", _sqlite_store, _sqlite_lock),
    "postgresql": Backend("postgresql", _postgres_store, lambda storage: Shared()),
}


def backend_kind(storage: StorageConfig) -> str:
    """The backend a `[storage]` section names: its `url`'s scheme, else the
    SQLite file at `path`."""
    if storage.url is None:
        return "sqlite"
    scheme = storage.url.partition("://")[0]
    return "postgresql" if scheme == "postgres" else scheme


def backend(storage: StorageConfig) -> Backend:
    return BACKENDS[backend_kind(storage)]


def open_store(storage: StorageConfig) -> Store:
    """The store `storage` names, built but not opened (call `open()`)."""
    return backend(storage).store(storage)


def serve_lock(storage: StorageConfig) -> ServeLock:
    """The lock `relay serve` holds on that store for its whole life."""
    return backend(storage).lock(storage)
