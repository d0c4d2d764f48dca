"""A running relay gives its memory back once quiet (relay/background/memory.py), and
only then: what it measures is tests/store/test_memory_release.py's."""

from __future__ import annotations

import asyncio

from conftest import ConfigFactory, RelayFactory, SinkFactory
from helpers import eventually, post_events


async def test_a_quiet_relay_gives_memory_back_once(
    make_config: ConfigFactory, start_relay: RelayFactory, start_sink: SinkFactory
) -> None:
    sink, url = await start_sink()
    config = make_config(
        {"crm": {"type": "http", "url": url}},
        {"orders": {"path": "/hooks/orders", "targets": ["crm"]}},
    )
    relay = await start_relay(config, poll_interval=0.05, memory_quiet=0.15)
    await post_events(relay.ingress_url + "/hooks/orders", 20)
    await sink.wait_for(20, timeout=5)

    async def released() -> bool:
        return relay.memory.releases == 1

    await eventually(released, timeout=5)
    await asyncio.sleep(0.3)  # quiet on, twice as long: nothing more to give
    assert relay.memory.releases == 1
    await post_events(relay.ingress_url + "/hooks/orders", 5)

    async def again() -> bool:
        return relay.memory.releases == 2

    await eventually(again, timeout=5)
