"""Alerts on a PostgreSQL cluster, in one process with an injected clock: two
relays on one database, each delivering some of the work, make one alert
between them, sent by the leading one; when it goes, the other sends."""

from __future__ import annotations

import json

import aiohttp
import pytest

from relay.app import Relay
from relay.core.clock import FakeClock

from conftest import ConfigFactory, RelayFactory, SinkFactory

pytestmark = pytest.mark.postgres


async def post(relay: Relay, keys: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for key in keys:
            async with http.post(
                relay.ingress_url + "/hooks/orders", data=b"{}", headers={"Idempotency-Key": key}
            ) as response:
                assert response.status == 200


async def test_two_instances_make_one_alert_sent_by_the_leader(
    make_config: ConfigFactory,
    start_relay: RelayFactory,
    start_sink: SinkFactory,
    pg_url: str,
) -> None:
    _crm, crm_url = await start_sink([400])  # not retried: each attempt goes dead
    ops, ops_url = await start_sink([200])
    config = make_config(
        {"crm": {"type": "http", "url": crm_url}, "ops": {"type": "http", "url": ops_url}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
        storage={"url": pg_url},
        alerts={"target": "ops", "failing_after": 3},
    )
    leader = await start_relay(config, background=False, clock=FakeClock())
    follower = await start_relay(config, background=False, clock=FakeClock())
    assert (leader.leadership.leading, follower.leadership.leading) == (True, False)
    # systemd's status line: only the leader counts the queue.
    assert (await leader.status_line()).startswith("leading the cluster: pending 0, dead 0,")
    assert (await follower.status_line()).startswith("following the cluster's leading instance")

    await post(leader, [f"a{i}" for i in range(5)])
    await leader.scheduler.drain()
    await post(follower, [f"b{i}" for i in range(5)])
    await follower.scheduler.drain()
    # The follower stores what it saw; it sends nothing itself.
    assert await follower.alerter.flush() is None
    assert await leader.alerter.flush() is not None
    await leader.scheduler.drain()
    await follower.scheduler.drain()
    assert len(ops.requests) == 1
    alert = json.loads(ops.requests[0].body)
    # Each instance counts the failures it saw, per route and target.
    assert alert["summary"] == (
        "relay: 10 deliveries went dead; target crm for route orders is failing"
    )
    assert {item["delivery_id"] for item in alert["dead"]} == {str(n) for n in range(1, 11)}

    # The leader goes: the other takes the lead and sends what it saw since.
    await leader.stop()
    await post(follower, [f"c{i}" for i in range(3)])
    await follower.scheduler.drain()
    assert await follower.leadership.check()
    assert await follower.alerter.flush() is not None
    await follower.scheduler.drain()
    assert len(ops.requests) == 2
    assert json.loads(ops.requests[1].body)["summary"] == "relay: 3 deliveries went dead"
