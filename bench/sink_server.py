"""A target for benchmarks: answers 200 at once and remembers when each event arrived.

    python bench/sink_server.py PORT OUTPUT

On SIGTERM it writes one line per delivery, "EVENT_ID ARRIVAL_TIME", to OUTPUT.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import uvloop
from aiohttp import web


async def main(port: int, output: str) -> None:
    arrivals: list[tuple[str, float]] = []

    async def handle(request: web.BaseRequest) -> web.Response:
        await request.read()
        arrivals.append((request.headers.get("X-Relay-Event-Id", "-"), time.time()))
        return web.Response(text="ok")

    server = web.Server(handle, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    lines = "".join(f"{event} {at}\n" for event, at in arrivals)
    await asyncio.to_thread(Path(output).write_text, lines)


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2]))
