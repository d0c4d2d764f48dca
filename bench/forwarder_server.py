"""The end-to-end baseline: a minimal forwarder that stores nothing.

    python bench/forwarder_server.py PORT SINK_URL CONCURRENCY

Each POST is read and forwarded to the sink with one shared aiohttp client
(at most CONCURRENCY requests to it at once, as relay's target allows), and
answered 200 once the sink has answered. Nothing is kept: a crash loses
whatever is in flight. It is what relay's delivery path costs at the least.
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import uvloop
from aiohttp import web


async def main(port: int, sink_url: str, concurrency: int) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        forwarded = 0

        async def handle(request: web.BaseRequest) -> web.Response:
            nonlocal forwarded
            body = await request.read()
            forwarded += 1
            headers = {
                "Content-Type": request.headers.get("Content-Type", "application/json"),
                "X-Relay-Event-Id": str(forwarded),
            }
            async with client.post(sink_url, data=body, headers=headers) as answer:
                await answer.read()
                status = 200 if answer.status < 300 else 502
            return web.Response(status=status, body=b'{"status":"forwarded"}')

        runner = web.ServerRunner(web.Server(handle, access_log=None), handle_signals=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
