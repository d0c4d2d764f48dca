"""A second baseline: aiohttp's low-level server (no Application, no router), the layer
relay's ingress is built on. It reads the body and answers 200, nothing else."""

from __future__ import annotations

import asyncio
import sys

import uvloop
from aiohttp import web

ANSWER = b'{"status":"queued","id":"1"}'


async def handle(request: web.BaseRequest) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


async def main(port: int) -> None:
    runner = web.ServerRunner(web.Server(handle, access_log=None), handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
