"""The public listener: take a webhook, put it on disk, and only then say 200.

Nothing slow happens here: match the route, bound the body, work out the
idempotency key, hand the event to the store's group commit, answer from
that commit's outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import orjson
from aiohttp import web

from relay.clock import Clock
from relay.config import Config, RouteConfig
from relay.incoming import Incoming, idempotency_key, plan_deliveries
from relay.metrics import Metrics
from relay.store import NewEvent, Store, StoreError

log = logging.getLogger("relay.ingress")

MAX_KEY_LENGTH = 512
# Seconds a sender is asked to wait after a 503: long enough for a full disk
# or a lock to clear, short enough to fit Tilda's 5 s window on a retry.
RETRY_AFTER_SECONDS = 5


class Ingress:
    def __init__(
        self,
        config: Config,
        store: Store,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        on_accepted: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._on_accepted = on_accepted
        self._routes: Mapping[str, RouteConfig] = {}
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        # One assignment: a request sees either the old routes or the new ones.
        self._routes = {route.path: route for route in config.routes.values()}

    def application(self) -> web.Application:
        largest = max((route.max_body_size for route in self._routes.values()), default=1)
        app = web.Application(client_max_size=largest)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        route = self._routes.get(request.path)
        if route is None:
            # The path is not a label: unknown paths must not grow the metrics.
            self._count("", "not_found")
            return _error(404, "no route for this path")
        response = await self._handle_route(request, route)
        if response.status == 200:
            self._metrics.ack_seconds.observe(time.perf_counter() - started)
        return response

    def _count(self, route: str, result: str) -> None:
        self._metrics.received.labels(route, result).inc()

    async def _handle_route(self, request: web.Request, route: RouteConfig) -> web.Response:
        if request.method != "POST":
            self._count(route.name, "method_not_allowed")
            return _error(405, "only POST is accepted here", headers={"Allow": "POST"})
        body = await _read_body(request, route.max_body_size)
        if body is None:
            self._count(route.name, "too_large")
            return _error(413, f"body larger than {route.max_body_size} bytes")
        incoming = Incoming(
            method=request.method,
            path=request.path,
            query=request.query_string,
            raw_headers=[
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in request.raw_headers
            ],
            body=body,
            remote=request.remote,
        )
        key = idempotency_key(route, incoming)
        if key is not None and len(key) > MAX_KEY_LENGTH:
            self._count(route.name, "bad_request")
            return _error(400, f"idempotency key longer than {MAX_KEY_LENGTH} characters")
        if key is None and route.require_idempotency_key:
            self._count(route.name, "bad_request")
            return _error(400, "this route requires an idempotency key")
        now = self._clock.now()
        event = NewEvent(
            route=route.name,
            idempotency_key=key,
            received_at=now,
            remote_addr=incoming.remote,
            method=incoming.method,
            path=incoming.path,
            query=incoming.query,
            headers=incoming.raw_headers,
            content_type=incoming.content_type,
            body=body,
        )
        deliveries = plan_deliveries(route, incoming)
        try:
            accepted = await self._store.accept_event(event, deliveries, now)
        except StoreError as error:
            log.error("route %s: event not stored, answering 503: %s", route.name, error)
            self._count(route.name, "unavailable")
            return _error(
                503, "cannot store the event now", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )
        if not accepted.duplicate:
            self._on_accepted()
        status = "duplicate" if accepted.duplicate else "queued"
        self._count(route.name, status)
        return _json(200, {"status": status, "id": str(accepted.event_id)})


async def _read_body(request: web.Request, limit: int) -> bytes | None:
    """The raw body, or None when it is larger than `limit` (read no further)."""
    length = request.content_length
    if length is not None:
        if length > limit:
            return None
        return await request.read()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def _json(status: int, payload: object, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps(payload),
        content_type="application/json",
        headers=headers,
    )


def _error(status: int, message: str, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return _json(status, {"error": message}, headers)
