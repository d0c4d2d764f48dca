from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

sys.path.insert(0, str(Path(__file__).parent))

from relay.app import Relay
from relay.config import Config, parse_config
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

ConfigFactory = Callable[..., Config]


@pytest.fixture(autouse=True)
def no_relay_left_running() -> Iterator[None]:
    """Every `relay serve` a test started is stopped when it ends, whatever
    happened: a test that failed or timed out before its own `finally` left
    one running for minutes, and its warnings failed unrelated tests."""
    yield
    killed = RelayProcess.reap()
    assert not killed, f"relay serve still running after the test: pids {killed}"


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
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


# PostgreSQL (tests marked `postgres`, run by .ci/run): one throwaway cluster
# for the session, a database per test copied from a migrated template.


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


def _in_thread(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` on a loop of its own: fixtures here are set up inside tests' loops."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, work).result()


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
    name = f"test_{uuid.uuid4().hex[:12]}"
    _in_thread(_admin(pg_cluster, f"CREATE DATABASE {name} TEMPLATE {PG_TEMPLATE}"))
    yield pg_cluster.url(name)
    _in_thread(_admin(pg_cluster, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


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
