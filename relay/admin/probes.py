"""/healthz, /readyz and /metrics: what a supervisor or a scraper reads, open
to anyone who may reach the admin listener (no token, no session)."""

from __future__ import annotations

import contextlib

from aiohttp import web

from relay.admin.api import json_response
from relay.admin.console import CONSOLE
from relay.ops.exposition import CONTENT_TYPE
from relay.store import StoreError


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    console = request.config_dict[CONSOLE]
    problems = []
    try:
        await console.store.heartbeat(console.clock.now())
    except StoreError as problem:
        problems.append(f"store not writable: {problem}")
    if not console.scheduler.running:
        problems.append("scheduler not running")
    if problems:
        return json_response({"status": "not ready", "problems": problems}, 503)
    return json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    console = request.config_dict[CONSOLE]
    # If the store cannot be read, counters still count and gauges keep their last reading.
    with contextlib.suppress(StoreError):
        await console.refresh_metrics()
    return web.Response(
        body=console.metrics.render(),
        headers={"Content-Type": CONTENT_TYPE},
    )


def add_probes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
