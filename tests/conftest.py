from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

sys.path.insert(0, str(Path(__file__).parent))

from relay.app import Relay
from relay.config import Config
from relay.loader import parse_config
from relay.store import Store
from relay.store.postgres import PostgresStore

from helpers import RelayProcess, Sink
from pgcluster import Cluster, create_cluster, remove_cluster, run_sql, server_bin
from store_backends import BACKENDS, Harness
from store_backends import PARAMS as BACKENDS_PARAMS

# relay's targets honour HTTPS_PROXY / HTTP_PROXY like curl: a proxy in the
# environment that runs the tests would carry their requests to servers on
# 127.0.0.1 away. The tests that mean one set it themselves.
for _name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
    os.environ.pop(_name, None)

PG_TEMPLATE = "relay_template"

T = TypeVar("T")

ConfigFactory = Callable[..., Config]


@pytest.fixture(autouse=True)
def no_relay_left_running() -> Iterator[None]:
    """Every `relay serve` a test started is stopped when it ends, whatever
    happened: a test that failed or timed out before its own `finally` left
    one running for minutes, and its warnings failed unrelated tests."""
    yield
    killed = RelayProcess.reap()
    assert not killed, f"relay serve still running after the test: pids {killed}"


# The HTTP transports (`transport` of an http or telegram target): the
# outbound suites and the hostile-target battery run over each.
TRANSPORTS = ("relay", "aiohttp")


@pytest.fixture
def transport() -> str | None:
    """The transport every target of `make_config` whose kind takes one gets
    unless it names one; None: the default. A module that runs over every
    transport overrides this fixture with `params=TRANSPORTS`."""
    return None


@pytest.fixture
def make_config(tmp_path: Path, transport: str | None) -> ConfigFactory:
    """A Config from plain dicts: ingress on a free port, database in tmp_path."""

    def make(
        targets: dict[str, Any],
        routes: dict[str, Any],
        *,
        retry: dict[str, Any] | None = None,
        server: dict[str, Any] | None = None,
        storage: dict[str, Any] | None = None,
        admin: dict[str, Any] | None = None,
        alerts: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> Config:
        if transport is not None:
            # Every target whose kind reads a `transport` key (the HTTP-style
            # ones) is given the one this run is over; asked of the kinds, so a
            # new one is covered without a list here.
            asked: set[str] = set()
            parse_config(
                {"targets": targets, "routes": {}}, environ or {}, base=tmp_path, asked_keys=asked
            )
            targets = {
                name: {"transport": transport, **settings}
                if f"targets.{name}.transport" in asked
                else settings
                for name, settings in targets.items()
            }
        data = {
            "server": {"listen": "127.0.0.1:0", "shutdown_timeout": "5s", **(server or {})},
            "storage": {"path": "relay.db", **(storage or {})},
            "admin": {"listen": "127.0.0.1:0", **(admin or {})},
            "retry": {"jitter": 0, **(retry or {})},
            "targets": targets,
            "routes": routes,
        }
        if alerts:
            data["alerts"] = alerts
        return parse_config(data, environ or {}, base=tmp_path)

    return make


SinkFactory = Callable[..., Awaitable[tuple[Sink, str]]]


@pytest.fixture
def start_sink(aiohttp_server: AiohttpServer) -> SinkFactory:
    """Start a recording target on 127.0.0.1; returns it and its URL."""

    async def start(script: Any = None, path: str = "/hook") -> tuple[Sink, str]:
        sink = Sink() if script is None else Sink(script=script)
        server = await aiohttp_server(sink.app())
        return sink, str(server.make_url(path))

    return start


RelayFactory = Callable[..., Awaitable[Relay]]


@pytest.fixture
async def start_relay() -> AsyncIterator[RelayFactory]:
    """Start relays in this process; each is stopped at the end of the test."""
    started: list[Relay] = []

    async def start(config: Config, *, background: bool = True, **kwargs: Any) -> Relay:
        relay = Relay(config, **kwargs)
        await relay.start(background=background)
        started.append(relay)
        return relay

    yield start
    for relay in reversed(started):
        await relay.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


# PostgreSQL: one throwaway cluster for the session (skipped, with the
# reason, where the server's binaries are missing). Tests marked `postgres`
# (run by .ci/run) get a database each, copied from a migrated template; the
# store contract, in the default run, shares one (ContractDatabase).


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    cluster = create_cluster()
    try:
        _in_thread(_make_template(cluster))
        yield cluster
    finally:
        remove_cluster(cluster)


def _in_thread(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on a loop of its own: fixtures here are set up inside tests' loops."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, work).result()


async def _admin(cluster: Cluster, sql: str) -> None:
    await run_sql(cluster.url("postgres"), sql)


async def _make_template(cluster: Cluster) -> None:
    await _admin(cluster, f"CREATE DATABASE {PG_TEMPLATE}")
    store = PostgresStore(cluster.url(PG_TEMPLATE), min_connections=1)
    await store.open()
    await store.close()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    yield from _fresh_database(pg_cluster)


@pytest.fixture
def other_pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A second one, for a test of two relays' databases."""
    yield from _fresh_database(pg_cluster)


def _fresh_database(pg_cluster: Cluster) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    _in_thread(_admin(pg_cluster, f"CREATE DATABASE {name} TEMPLATE {PG_TEMPLATE}"))
    yield pg_cluster.url(name)
    _in_thread(_admin(pg_cluster, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


PG_CONTRACT = "relay_contract"


class ContractDatabase:
    """One migrated database the store contract shares across the session.

    The contract's PostgreSQL tests run in the default suite, where a
    database copied for each (`CREATE DATABASE ... TEMPLATE`, then DROP)
    costs ten times what emptying one does; so each starts from the same
    database emptied back to what the migrations left: every table but
    schema_migrations deleted, the rows the migrations seed put back,
    identities restarted, and any session a failed test left behind ended
    (its advisory locks and LISTENs with it).
    """

    def __init__(
        self, url: str, reset: list[str], seeds: dict[str, tuple[list[str], list[tuple[Any, ...]]]]
    ) -> None:
        self.url = url
        self._reset = reset
        self._seeds = seeds

    @classmethod
    async def create(cls, cluster: Cluster) -> ContractDatabase:
        import asyncpg

        await _admin(cluster, f"CREATE DATABASE {PG_CONTRACT} TEMPLATE {PG_TEMPLATE}")
        url = cluster.url(PG_CONTRACT)
        connection = await asyncpg.connect(url)
        try:
            tables = [
                row["table_name"]
                for row in await connection.fetch(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
                    " AND table_name <> 'schema_migrations' ORDER BY table_name"
                )
            ]
            identities = await connection.fetch(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = 'public' AND is_identity = 'YES'"
            )
            # table -> (its columns, the rows the migrations put in it)
            seeds = {
                table: (list(rows[0].keys()), [tuple(row.values()) for row in rows])
                for table in tables
                if (rows := await connection.fetch(f"SELECT * FROM {table}"))
            }
        finally:
            await connection.close()
        reset = [
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{PG_CONTRACT}' AND pid <> pg_backend_pid()",
            *(f"DELETE FROM {table}" for table in tables),
            *(
                f"ALTER TABLE {row['table_name']} ALTER COLUMN {row['column_name']} RESTART"
                for row in identities
            ),
        ]
        return cls(url, reset, seeds)

    async def empty(self) -> None:
        import asyncpg

        connection = await asyncpg.connect(self.url)
        try:
            async with connection.transaction():
                for statement in self._reset:
                    await connection.execute(statement)
                for table, (columns, records) in self._seeds.items():
                    await connection.copy_records_to_table(table, records=records, columns=columns)
        finally:
            await connection.close()


@pytest.fixture(scope="session")
def pg_contract(pg_cluster: Cluster) -> ContractDatabase:
    return _in_thread(ContractDatabase.create(pg_cluster))


@pytest.fixture
def pg_contract_url(pg_contract: ContractDatabase) -> str:
    """The contract's shared database, as freshly migrated."""
    _in_thread(pg_contract.empty())
    return pg_contract.url


@pytest.fixture
def pg_cluster_url_empty(pg_cluster: Cluster) -> Iterator[str]:
    """A database with nothing in it, not even relay's schema."""
    name = f"empty_{uuid.uuid4().hex[:12]}"
    _in_thread(_admin(pg_cluster, f"CREATE DATABASE {name}"))
    yield pg_cluster.url(name)
    _in_thread(_admin(pg_cluster, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(params=BACKENDS_PARAMS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """The store contract's backend: each contract test runs once per backend
    in store_backends.BACKENDS (PostgreSQL's marked `postgres`)."""
    database, _ = BACKENDS[request.param]
    harness = Harness(request.param, database(request, tmp_path))
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def store(backend: Harness) -> Store:
    """A store opened on the contract's backend (tests/store/ override it where
    they test one backend's own behaviour)."""
    return await backend.open()
