"""The backends the store contract (tests/store/test_contract*.py) runs
against; the `backend` and `store` fixtures in conftest.py run every contract
test once per entry of BACKENDS.

A harness opens stores through `relay.store.open_store` (the selection point
`relay serve` uses) on a fresh, empty database that belongs to the test;
`open()` again gives another store on the same database, as a restart after
a crash would. Adding a backend is one entry in BACKENDS (how a test gets its
own database, as a [storage] section; the marker that selects the run): the
contract suite runs over it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from relay.config import StorageConfig
from relay.store import Store, open_store


class Harness:
    def __init__(self, kind: str, storage: StorageConfig) -> None:
        self.kind = kind
        self.storage = storage
        self._open: list[Store] = []

    async def open(self) -> Store:
        """A newly opened store on this test's database."""
        store = open_store(self.storage)
        await store.open()
        self._open.append(store)
        return store

    async def restart(self, store: Store) -> Store:
        """Close `store` as a process that ends would (leases it holds stay as
        they are) and open a new one on the same database."""
        self._open.remove(store)
        await store.close()
        return await self.open()

    async def close(self) -> None:
        """Close every store still open."""
        while self._open:
            await self._open.pop().close()


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> StorageConfig:
    # A short busy timeout: a contract test never waits on a lock.
    return StorageConfig(path=tmp_path / "relay.db", busy_timeout=0.2)


def _postgresql(request: pytest.FixtureRequest, tmp_path: Path) -> StorageConfig:
    # The session's contract database, emptied back to a freshly migrated
    # one before each test (conftest.pg_contract_url). Skipped, with the
    # reason, where no PostgreSQL server can be started.
    return StorageConfig(url=request.getfixturevalue("pg_contract_url"))


Database = Callable[[pytest.FixtureRequest, Path], StorageConfig]

# kind -> (this test's database, marks selecting the run). Both run in the
# default suite: a backend the default run leaves out is a backend a change
# can break unseen.
BACKENDS: dict[str, tuple[Database, tuple[pytest.MarkDecorator, ...]]] = {
    "sqlite": (_sqlite, ()),
    "postgresql": (_postgresql, ()),
}

PARAMS = [pytest.param(kind, marks=marks) for kind, (_, marks) in BACKENDS.items()]
