"""The end-to-end baseline: a minimal forwarder that stores nothing.

    python bench/forwarder_server.py PORT SINK_URL CONCURRENCY [aiohttp|relay]

Each POST is read and forwarded to the sink with one shared aiohttp client
(at most CONCURRENCY requests to it at once, as relay's target allows), and
answered 200 once the sink has answered. Nothing is kept: a crash loses
whatever is in flight. It is what relay's delivery path costs at the least.

With `relay` as the last argument the forwarder sends with relay's own
client (relay.targets.outbound.client) instead: the baseline with relay's lean client, so
that what relay's storage and scheduling cost is seen apart from the client.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop
from aiohttp import web

Send = Callable[[dict[str, str], bytes], Awaitable[int]]  # headers, body -> status


async def forward(port: int, send: Send) -> None:
    forwarded = 0

    async def handle(request: web.BaseRequest) -> web.Response:
        nonlocal forwarded
        body = await request.read()
        forwarded += 1
        headers = {
            "Content-Type": request.headers.get("Content-Type", "application/json"),
            "X-Relay-Event-Id": str(forwarded),
        }
        status = 200 if await send(headers, body) < 300 else 502
        return web.Response(status=status, body=b'{"status":"forwarded"}')

    runner = web.ServerRunner(web.Server(handle, access_log=None), handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


async def with_aiohttp(port: int, sink_url: str, concurrency: int) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:

        async def send(headers: dict[str, str], body: bytes) -> int:
            async with client.post(sink_url, data=body, headers=headers) as answer:
                await answer.read()
                return answer.status

        await forward(port, send)


async def with_relays_client(port: int, sink_url: str, concurrency: int) -> None:
    from relay.targets.outbound.client import Client

    client = Client(keep=concurrency)
    slots = asyncio.Semaphore(concurrency)  # aiohttp's connector limit, as above

    async def send(headers: dict[str, str], body: bytes) -> int:
        async with slots:
            answer = await client.request("POST", sink_url, headers, body, keep=2048)
        return answer.status

    await forward(port, send)


if __name__ == "__main__":
    client = sys.argv[4] if len(sys.argv) > 4 else "aiohttp"
    forwarder = with_relays_client if client == "relay" else with_aiohttp
    uvloop.run(forwarder(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
