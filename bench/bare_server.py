"""The baseline: an aiohttp + uvloop handler that reads the body and answers 200, nothing else."""

from __future__ import annotations

import sys

import uvloop
from aiohttp import web


async def handle(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"status": "queued", "id": "1"})


def main() -> None:
    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
