"""Three `relay serve` processes on one PostgreSQL database, as a user runs them
behind a load balancer: webhooks posted round-robin, instances killed and the
database restarted while they arrive, then everything counted at the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
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


# Alert grouping, retention and the queue gauges: one instance of the cluster
# (the one leading) runs them, and another takes over when it dies.


def singleton_config(tmp_path: Path, crm_url: str, ops_url: str, audit_url: str) -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "storage": {"url": "${RELAY_DB_URL}", "retention": "1s"},
            "alerts": {"target": "ops", "failing_after": 3, "group_window": "2s"},
            "targets": {
                # 400 is not retried: each attempt makes its delivery dead.
                "crm": {"type": "http", "url": crm_url, "concurrency": 4},
                "ops": {"type": "http", "url": ops_url},
                "audit": {"type": "http", "url": audit_url},
            },
            "routes": {
                "orders": {"path": "/hooks/orders", "targets": ["crm"]},
                "audit": {"path": "/hooks/audit", "targets": ["audit"]},
            },
        },
    )


async def scrape(http: aiohttp.ClientSession, relay: RelayProcess) -> str:
    async with http.get(f"{relay.admin_url}/metrics") as response:
        assert response.status == 200
        return await response.text()


async def leading(http: aiohttp.ClientSession, relays: list[RelayProcess]) -> list[RelayProcess]:
    """The instances whose /metrics say they lead the cluster."""
    pages = [await scrape(http, relay) for relay in relays]
    return [relay for relay, page in zip(relays, pages, strict=True) if LEADS in page]


LEADS = "\nrelay_cluster_leader 1.0\n"


async def post_keys(relays: list[RelayProcess], path: str, keys: list[str]) -> None:
    turn = itertools.cycle(relays)
    async with aiohttp.ClientSession() as http:
        for key in keys:
            async with http.post(
                f"{next(turn).url}{path}", json={"key": key}, headers={"Idempotency-Key": key}
            ) as response:
                assert response.status == 200, await response.text()


async def slowly_refused(request: web.Request, number: int) -> web.Response:
    await asyncio.sleep(0.05)  # attempts overlap: every instance claims some
    return web.Response(status=400, text="no such lead")


async def test_a_cluster_sends_one_alert_for_what_every_instance_saw(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    crm, ops, audit = Sink(script=slowly_refused), Sink(), Sink()
    urls = [str((await aiohttp_server(s.app())).make_url("/hook")) for s in (crm, ops, audit)]
    config = singleton_config(tmp_path, *urls)
    async with instances(config, tmp_path, pg_url) as relays, aiohttp.ClientSession() as http:
        await post_keys(relays, "/hooks/orders", [f"k{i}" for i in range(30)])
        await crm.wait_for(30, timeout=30)
        # Each instance made deliveries dead: each saw something to alert about.
        assert all("outcome=dead" in relay.log() for relay in relays), "not every instance sent"
        await ops.wait_for(1, timeout=15)
        await asyncio.sleep(3.5)  # past another group window and a leadership check
        assert len(ops.requests) == 1, [json.loads(r.body)["summary"] for r in ops.requests]
        alert = json.loads(ops.requests[0].body)
        assert alert["dead_count"] == 30
        assert alert["summary"] == "relay: 30 deliveries went dead; target crm is failing"
        # Only the leading instance exports the queue gauges: summed over every
        # scraped instance, the dead deliveries count once.
        pages = [await scrape(http, relay) for relay in relays]
        assert sum(LEADS in page for page in pages) == 1, pages
        dead = 'relay_deliveries{status="dead",target="crm"} 30.0'
        assert [dead in page for page in pages] == [LEADS in page for page in pages]
        followers = [page for page in pages if LEADS not in page]
        assert all("relay_deliveries{" not in page for page in followers)
        assert all("\nrelay_cluster_leader 0.0\n" in page for page in followers)
        # Counters stay each instance's own.
        assert all("relay_attempts_total{" in page for page in pages)


async def test_kill_9_of_the_leader_moves_alerts_and_retention_to_another(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    crm, ops, audit = Sink(script=slowly_refused), Sink(), Sink()
    urls = [str((await aiohttp_server(s.app())).make_url("/hook")) for s in (crm, ops, audit)]
    config = singleton_config(tmp_path, *urls)
    async with instances(config, tmp_path, pg_url) as relays, aiohttp.ClientSession() as http:
        [leader] = await leading(http, relays)
        survivors = [relay for relay in relays if relay is not leader]
        # Finished events past retention (1 s) wait for the leader's next pass,
        # 10 minutes after its first: a new leader makes one at once.
        await post_keys(relays, "/hooks/audit", [f"a{i}" for i in range(10)])
        await audit.wait_for(10, timeout=30)
        await asyncio.sleep(1.5)
        assert await count_events(pg_url, "audit") == 10
        await asyncio.to_thread(leader.kill)
        killed_at = time.monotonic()

        async def taken_over() -> bool:
            return len(await leading(http, survivors)) == 1

        await eventually(taken_over, timeout=10)
        took = time.monotonic() - killed_at
        [successor] = await leading(http, survivors)

        async def purged() -> bool:
            return await count_events(pg_url, "audit") == 0

        await eventually(purged, timeout=10)
        assert "retention removed 10 finished events" in successor.log()
        assert all("retention removed" not in r.log() for r in survivors if r is not successor)
        # What the survivors see go dead is still said, once, by the new leader.
        await post_keys(survivors, "/hooks/orders", [f"k{i}" for i in range(10)])
        await ops.wait_for(1, timeout=15)
        await asyncio.sleep(3.5)
        assert len(ops.requests) == 1, [json.loads(r.body)["summary"] for r in ops.requests]
        assert json.loads(ops.requests[0].body)["dead_count"] == 10
        print(f"lead taken over {took:.2f}s after kill -9")
        assert took < 3  # docs/postgres.md: "within about a second"


async def count_events(url: str, route: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        return int(await connection.fetchval("SELECT COUNT(*) FROM events WHERE route = $1", route))
    finally:
        await connection.close()


def named_config(tmp_path: Path, audit_url: str) -> Path:
    return write_config(
        tmp_path / "relay.toml",
        {
            "storage": {
                "url": "${RELAY_DB_URL}",
                "instance_id": "${RELAY_INSTANCE}",
                "dead_after": "2s",
            },
            "targets": {"audit": {"type": "http", "url": audit_url}},
            "routes": {"audit": {"path": "/hooks/audit", "targets": ["audit"]}},
        },
    )


def named(config: Path, log: Path, url: str, name: str) -> RelayProcess:
    return RelayProcess(config, log, env={"RELAY_DB_URL": url, "RELAY_INSTANCE": name})


async def test_a_second_instance_with_a_running_ones_name_refuses_to_start(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    audit = Sink()
    config = named_config(tmp_path, str((await aiohttp_server(audit.app())).make_url("/hook")))
    first = named(config, tmp_path / "first.log", pg_url, "vps-1")
    second = named(config, tmp_path / "second.log", pg_url, "vps-1")
    again = named(config, tmp_path / "again.log", pg_url, "vps-1")
    try:
        await asyncio.to_thread(first.start)
        with pytest.raises(AssertionError, match="relay serve exited 1") as refused:
            await asyncio.to_thread(second.start)
        assert (
            "relay: another relay instance named 'vps-1' is running on this database:"
            " give each instance its own [storage] instance_id"
        ) in str(refused.value)
        # Its name is free as soon as it is gone: a restart after kill -9 waits for nothing.
        await asyncio.to_thread(first.kill)
        await asyncio.to_thread(again.start)
    finally:
        for relay in (first, second, again):
            await relay.astop()


async def test_a_frozen_leader_loses_the_lead_after_dead_after(
    tmp_path: Path, aiohttp_server: AiohttpServer, pg_url: str
) -> None:
    """A leader that hangs (a frozen VM) does not close its session: the server
    ends it after `[storage] dead_after` of silence, and another instance leads."""
    audit = Sink()
    config = named_config(tmp_path, str((await aiohttp_server(audit.app())).make_url("/hook")))
    relays = [named(config, tmp_path / f"relay{n}.log", pg_url, f"vps-{n}") for n in range(2)]
    try:
        for relay in relays:
            await asyncio.to_thread(relay.start)
        connection = await asyncpg.connect(pg_url)
        try:
            names = {row[0] for row in await connection.fetch("SELECT id FROM instances")}
        finally:
            await connection.close()
        assert names == {"vps-0", "vps-1"}
        async with aiohttp.ClientSession() as http:
            [leader] = await leading(http, relays)
            [other] = [relay for relay in relays if relay is not leader]
            assert leader.process is not None
            leader.process.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:

                async def taken_over() -> bool:
                    return len(await leading(http, [other])) == 1

                await eventually(taken_over, timeout=15)
                took = time.monotonic() - stopped_at
            finally:
                leader.process.send_signal(signal.SIGCONT)
            # Back, the old leader finds its session ended: one leader, not two.
            await asyncio.sleep(1.5)
            assert await leading(http, relays) == [other]
            assert "no longer leading the cluster" in leader.log()
        print(f"lead taken from a frozen leader {took:.2f}s after SIGSTOP (dead_after 2s)")
        assert 1.5 < took < 5
    finally:
        for relay in relays:
            await relay.astop()
