"""Three `relay serve` processes on one PostgreSQL database, as a user runs them
behind a load balancer: webhooks posted round-robin, instances killed and the
database restarted while they arrive, then everything counted at the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from relay.store.pg_cluster import LEADER_LOCK

from helpers import RelayProcess, Sink, eventually, write_config
from pgcluster import Cluster, create_cluster, remove_cluster, server_bin

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


def cluster_config(tmp_path: Path, target_url: str, **target: Any) -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"url": "${RELAY_DB_URL}", "busy_timeout": "2s"},
            "retry": {"unit": "50ms", "max_delay": "500ms", "retries": 1000},
            "targets": {"crm": {"type": "http", "url": target_url, **target}},
            "routes": {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        },
    )


@contextlib.asynccontextmanager
async def instances(
    config: Path, tmp_path: Path, url: str, count: int = 3
) -> AsyncIterator[list[RelayProcess]]:
    relays = [
        RelayProcess(config, tmp_path / f"relay{n}.log", env={"RELAY_DB_URL": url})
        for n in range(count)
    ]
    try:
        for relay in relays:
            await asyncio.to_thread(relay.start)
        yield relays
    finally:
        for relay in relays:
            await relay.astop()


async def post_round_robin(
    relays: list[RelayProcess],
    keys: list[str],
    acked: dict[str, str],
    answers: list[tuple[int, str | None]] | None = None,
    after_each: float = 0.0,
) -> None:
    """Post each key to the next instance; record the id of every 200."""
    turn = itertools.cycle(relays)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=48)) as http:

        async def one(key: str, relay: RelayProcess) -> None:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.post(
                    f"{relay.url}/hooks/orders",
                    json={"key": key},
                    headers={"Idempotency-Key": key},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    if answers is not None:
                        answers.append((response.status, response.headers.get("Retry-After")))
                    if response.status == 200:
                        acked[key] = str((await response.json())["id"])

        if after_each:
            for key in keys:
                await one(key, next(turn))
                await asyncio.sleep(after_each)
        else:
            await asyncio.gather(*(one(key, next(turn)) for key in keys))


def delivered(sink: Sink) -> list[str]:
    return [r.headers["X-Relay-Event-Id"] for r in sink.requests]


async def test_three_instances_deliver_every_event_once(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    sink = Sink()
    server = await aiohttp_server(sink.app())
    config = cluster_config(tmp_path, str(server.make_url("/hook")))
    async with instances(config, tmp_path, pg_url) as relays:
        acked: dict[str, str] = {}
        await post_round_robin(relays, [f"k{i}" for i in range(150)], acked)
        assert len(acked) == 150
        wanted = set(acked.values())
        await eventually(lambda_async(lambda: wanted <= set(delivered(sink))), timeout=60)
        received = delivered(sink)
        assert len(received) - len(set(received)) == 0  # duplicates
        # Every instance did some of the sending: one queue, claimed by whoever is free.
        sends = [relay.log().count("outcome=success") for relay in relays]
        assert all(count > 0 for count in sends), sends


def lambda_async(check: Any) -> Any:
    async def wrapped() -> bool:
        return bool(check())

    return wrapped


async def test_kill_9_of_one_instance_under_load_loses_nothing(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    async def slow(request: web.Request, number: int) -> web.Response:
        await asyncio.sleep(0.2)  # attempts are under way when the kill comes
        return web.Response(text="ok")

    sink = Sink(script=slow)
    server = await aiohttp_server(sink.app())
    config = cluster_config(tmp_path, str(server.make_url("/hook")), concurrency=8)
    async with instances(config, tmp_path, pg_url) as relays:
        acked: dict[str, str] = {}
        sending = asyncio.create_task(
            post_round_robin(relays, [f"k{i}" for i in range(300)], acked, after_each=0.005)
        )
        await eventually(lambda_async(lambda: len(sink.requests) >= 30), timeout=30)
        await asyncio.to_thread(relays[1].kill)  # SIGKILL, mid-attempt and mid-burst
        await sending
        assert len(acked) >= 150
        wanted = set(acked.values())
        # Its leases are taken over once it is seen dead (10 s), not at lease expiry.
        await eventually(lambda_async(lambda: wanted <= set(delivered(sink))), timeout=60)
        received = delivered(sink)
        duplicates = len(received) - len(set(received))
        # At least once: only attempts cut by the kill may repeat.
        assert duplicates <= 8 * 2, duplicates
        print(f"acked {len(acked)}, delivered {len(set(received))}, duplicates {duplicates}")


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A cluster this test may stop and start."""
    if server_bin() is None:
        pytest.skip("PostgreSQL server binaries not found")
    cluster = create_cluster()
    try:
        yield cluster
    finally:
        remove_cluster(cluster)


async def test_a_database_restart_under_load_answers_503_then_recovers(
    tmp_path: Path, aiohttp_server: AiohttpServer, own_cluster: Cluster
) -> None:
    sink = Sink()
    server = await aiohttp_server(sink.app())
    config = cluster_config(tmp_path, str(server.make_url("/hook")))
    async with instances(config, tmp_path, own_cluster.url("postgres")) as relays:
        acked: dict[str, str] = {}
        await post_round_robin(relays, [f"before{i}" for i in range(30)], acked)
        assert len(acked) == 30
        await asyncio.to_thread(own_cluster.stop, "fast")
        answers: list[tuple[int, str | None]] = []
        await post_round_robin(relays, [f"down{i}" for i in range(15)], acked, answers)
        assert answers
        assert all(status == 503 and retry for status, retry in answers), answers
        await asyncio.to_thread(own_cluster.start)
        # No restart of relay: each instance reconnects by itself.
        later = [f"after{i}" for i in range(30)]

        async def accepted_again() -> bool:
            await post_round_robin(relays, later, acked)
            return all(key in acked for key in later)

        await eventually(accepted_again, timeout=60)
        wanted = set(acked.values())
        await eventually(lambda_async(lambda: wanted <= set(delivered(sink))), timeout=60)
        assert not any(key.startswith("down") for key in acked)


async def test_a_rate_holds_across_three_instances_at_the_sink(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    sink = Sink()
    server = await aiohttp_server(sink.app())
    config = cluster_config(tmp_path, str(server.make_url("/hook")), rate="5/s")
    async with instances(config, tmp_path, pg_url) as relays:
        acked: dict[str, str] = {}
        await post_round_robin(relays, [f"k{i}" for i in range(25)], acked)
        await sink.wait_for(25, timeout=60)
        times = sorted(r.at for r in sink.requests)
        busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
        assert busiest <= 5, busiest
        senders = [relay.log().count("outcome=success") for relay in relays]
        print(f"busiest one-second window: {busiest}; sends per instance: {senders}")


async def test_exactly_one_instance_leads_retention(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    sink = Sink()
    server = await aiohttp_server(sink.app())
    config = cluster_config(tmp_path, str(server.make_url("/hook")))

    async def leaders() -> list[int]:
        connection = await asyncpg.connect(pg_url)
        try:
            rows = await connection.fetch(
                "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE l.locktype = 'advisory' AND l.granted"
                " AND (l.classid::bigint << 32) + l.objid::bigint = $1",
                LEADER_LOCK,
            )
        finally:
            await connection.close()
        return [row[0] for row in rows]

    async with instances(config, tmp_path, pg_url) as relays:
        # Each instance's retention job asks for the lead as it starts: one gets it.
        await eventually(lambda_async_await(leaders, 1), timeout=20)
        await asyncio.sleep(1)
        assert len(await leaders()) == 1
        assert all(relay.process and relay.process.poll() is None for relay in relays)


def lambda_async_await(query: Any, count: int) -> Any:
    async def wrapped() -> bool:
        return len(await query()) == count

    return wrapped
