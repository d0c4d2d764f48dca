"""The public listener: take a webhook, put it on disk, and only then say 200.

Nothing slow happens here: match the route, bound the body, work out the
idempotency key, hand the event to the store's group commit, answer from
that commit's outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from relay.clock import Clock
from relay.config import Answer, Config, RouteConfig
from relay.encoding import ACCEPT_ENCODING, BadEncoding, BodyTooLarge, coding_of, inflate
from relay.httplog import server_log
from relay.incoming import Incoming, idempotency_key, plan_deliveries
from relay.metrics import Metrics
from relay.netaddr import Network, client_address, within
from relay.payload import Payload
from relay.sandbox import one_budget
from relay.secrets import Masker
from relay.sources import Ping, Reject, Source, build_source
from relay.store import Accepted, Health, Intake, NewEvent, Rejection, StoreError

log = logging.getLogger("relay.ingress")


class IngressStore(Intake, Health, Protocol):
    """Ingress stores events and refusals, and asks per request whether it may."""


MAX_KEY_LENGTH = 512
# Seconds a sender is asked to wait after a 503: long enough for a full disk
# or a lock to clear, short enough to fit Tilda's 5 s window on a retry.
RETRY_AFTER_SECONDS = 5
# At most this many rejections a second per route are written down; a flood
# of forged requests is counted in the metrics but cannot flood the disk.
REJECTIONS_LOGGED_PER_SECOND = 10
# Body bytes all requests together may hold while they are received and
# stored (at least four of the largest route's bodies): 300 stalled 1 MiB
# uploads held 357 MiB before; past this the sender gets 503 and Retry-After.
BODIES_IN_FLIGHT = 64 * 1024 * 1024
JSON_HEADERS = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))


@dataclass(frozen=True)
class _Route:
    config: RouteConfig
    source: Source
    templated: bool


@dataclass(frozen=True)
class _Settings:
    routes: Mapping[str, _Route]
    trusted_proxies: tuple[Network, ...]
    masker: Masker
    read_timeout: float
    bodies_in_flight_limit: int


class Ingress:
    def __init__(
        self,
        config: Config,
        store: IngressStore,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        on_accepted: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._on_accepted = on_accepted
        self._rejections_logged: dict[str, tuple[int, int]] = {}
        self._counters = self._metrics.ingress
        self._background: set[asyncio.Task[None]] = set()
        self._bodies_in_flight = 0
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        # One assignment: a request sees either the old routes or the new ones.
        self._settings = _Settings(
            routes={
                route.path: _Route(route, build_source(route), route.templated)
                for route in config.routes.values()
            },
            trusted_proxies=config.server.trusted_proxies,
            masker=config.masker,
            read_timeout=config.server.read_timeout,
            bodies_in_flight_limit=max(
                BODIES_IN_FLIGHT,
                4 * max((route.max_body_size for route in config.routes.values()), default=0),
            ),
        )

    async def close(self) -> None:
        """Wait for rejections still being written down."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def server(self) -> web.Server:
        """aiohttp's low-level server: no router, no middlewares, no Application.

        Ingress matches its routes itself (a dict lookup that a reload swaps at
        once), and skipping aiohttp's web-application layer saves about a third
        of the HTTP stack's time per request.
        """
        # A connection has read_timeout to send its request headers (aiohttp's
        # keep-alive timer also runs from the moment a connection opens), and
        # an idle keep-alive connection is closed after as long: one that sends
        # nothing or half a header must not hold a descriptor for a minute.
        return web.Server(
            self.handle,
            access_log=None,
            keepalive_timeout=self._settings.read_timeout,
            max_headers=100,
            # Compressed bodies are inflated by relay itself, within the route's
            # limit (relay/encoding.py): aiohttp's inflation had no bound and
            # made Content-Length count the wrong bytes.
            auto_decompress=False,
            logger=server_log,
        )

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        settings = self._settings
        route = settings.routes.get(request.path)
        if route is None:
            # The path is not a label: unknown paths must not grow the metrics.
            self._count("", "not_found")
            return _error(404, "no route for this path")
        # Memory for bodies being received is bounded: each request holds its
        # declared length (or its route's limit when chunked) until answered.
        length = request.content_length
        held = (
            route.config.max_body_size
            if length is None
            else min(length, route.config.max_body_size)
        )
        if self._bodies_in_flight + held > settings.bodies_in_flight_limit:
            self._count(route.config.name, "busy")
            return _error(
                503,
                "too many bodies being received at once",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        self._bodies_in_flight += held
        try:
            if route.templated:
                with one_budget():  # the request's templates together: LOOP_SECONDS at most
                    response = await self._handle_route(request, route, settings)
            else:  # nothing to budget, and a budget costs as much as the route lookup
                response = await self._handle_route(request, route, settings)
        finally:
            self._bodies_in_flight -= held
        if response.status == 200:
            self._counters.observe_ack(time.perf_counter() - started)
        return response

    def _count(self, route: str, result: str) -> None:
        self._counters.count(route, result)

    async def _handle_route(
        self, request: web.BaseRequest, bundle: _Route, settings: _Settings
    ) -> web.Response:
        route = bundle.config
        remote = client_address(
            request.remote, request.headers.get("X-Forwarded-For"), settings.trusted_proxies
        )
        if route.allow_ips and not within(remote, route.allow_ips):
            return self._reject(
                route,
                request,
                remote,
                settings.masker,
                Reject("ip_not_allowed", f"{remote} is not in allow_ips"),
                403,
            )
        if request.method != "POST":
            self._count(route.name, "method_not_allowed")
            return _error(405, "only POST is accepted here", headers={"Allow": "POST"})
        coding = coding_of(request.headers.get("Content-Encoding"))
        if coding is None:
            self._count(route.name, "unsupported_encoding")
            return _error(
                415,
                f"Content-Encoding must be one of {ACCEPT_ENCODING}, or none",
                headers={"Accept-Encoding": ACCEPT_ENCODING},
            )
        try:
            if request.content.is_eof():
                # The whole body came with the headers (nearly always for a
                # webhook): reading it cannot wait, so it needs no timer.
                body = await _read_body(request, route.max_body_size)
            else:
                async with asyncio.timeout(settings.read_timeout):
                    body = await _read_body(request, route.max_body_size)
        except TimeoutError:
            self._count(route.name, "timeout")
            return _error(408, f"body not received within {settings.read_timeout:g}s")
        if body is not None and coding:
            try:
                body = inflate(coding, body, route.max_body_size)
            except BodyTooLarge:
                body = None
            except BadEncoding as error:
                self._count(route.name, "bad_request")
                return _error(400, f"body is not valid {coding}: {error}")
        if body is None:
            self._count(route.name, "too_large")
            return _error(413, f"body larger than {route.max_body_size} bytes")
        headers = request.headers
        payload = Payload(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=[
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in request.raw_headers
            ],
            content_type=headers.get("Content-Type"),
            body=body,
        )
        incoming = Incoming(payload, remote, header_view=headers)
        now = self._clock.now()
        check = bundle.source.check(incoming, now)
        if isinstance(check, Ping):
            self._count(route.name, "ping")
            return _answer(check.answer)
        if isinstance(check, Reject):
            return self._reject(route, request, remote, settings.masker, check, 401)
        key = idempotency_key(route, incoming, check.key)
        if key is not None and len(key) > MAX_KEY_LENGTH:
            self._count(route.name, "bad_request")
            return _error(400, f"idempotency key longer than {MAX_KEY_LENGTH} characters")
        if key is None and route.require_idempotency_key:
            self._count(route.name, "bad_request")
            return _error(400, "this route requires an idempotency key")
        event = NewEvent(
            route=route.name,
            idempotency_key=key,
            received_at=now,
            remote_addr=remote,
            payload=payload.as_stored(),
        )
        deliveries = plan_deliveries(route, incoming)
        if self._store.file_problem() is not None:
            # Acknowledged into a deleted file, the event would be gone at restart.
            self._count(route.name, "unavailable")
            return _error(
                503, "cannot store the event now", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )
        try:
            accepted = await self._store.accept_event(
                event, deliveries, now, refuse_conflict=route.key_conflict == "reject"
            )
        except StoreError as error:
            log.error("route %s: event not stored, answering 503: %s", route.name, error)
            self._count(route.name, "unavailable")
            return _error(
                503, "cannot store the event now", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
            )
        if accepted.conflict_of is not None:
            self._key_conflict(route, event, accepted)
            if accepted.refused:
                return _error(
                    422,
                    f"idempotency key {event.idempotency_key!r} was already used for event"
                    f" {accepted.conflict_of} with a different payload",
                )
        if not accepted.duplicate:
            self._on_accepted()
        status = "duplicate" if accepted.duplicate else "queued"
        self._count(route.name, status)
        answer = route.response or bundle.source.answer
        if answer is not None:
            return _answer(answer)
        body = b'{"status":"%s","id":"%d"}' % (status.encode(), accepted.event_id)
        return web.Response(body=body, headers=JSON_HEADERS)

    def _key_conflict(self, route: RouteConfig, event: NewEvent, accepted: Accepted) -> None:
        self._metrics.key_conflicts.labels(route.name).inc()
        if accepted.refused:
            self._count(route.name, "key_conflict")
            outcome = 'refused with 422 (key_conflict = "reject")'
        else:
            outcome = f"stored as event {accepted.event_id}, flagged as a key conflict"
        log.warning(
            "route %s: idempotency key %r already names event %d, whose payload differs: %s",
            route.name,
            event.idempotency_key,
            accepted.conflict_of,
            outcome,
        )

    def _reject(
        self,
        route: RouteConfig,
        request: web.BaseRequest,
        remote: str | None,
        masker: Masker,
        rejection: Reject,
        status: int,
    ) -> web.Response:
        self._count(route.name, "rejected")
        self._metrics.rejected.labels(route.name, rejection.reason).inc()
        log.warning(
            "route %s: refused a request from %s: %s%s",
            route.name,
            remote,
            rejection.reason,
            f" ({rejection.detail})" if rejection.detail else "",
        )
        if self._may_log_rejection(route.name):
            record = Rejection(
                route=route.name,
                at=self._clock.now(),
                remote_addr=remote,
                reason=rejection.reason,
                detail=masker.text(rejection.detail),
                headers=masker.headers(
                    (name.decode("latin-1"), value.decode("latin-1"))
                    for name, value in request.raw_headers
                ),
            )
            task = asyncio.create_task(self._store_rejection(record))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        # The sender learns only that it was refused, not which check failed.
        return _error(status, "forbidden" if status == 403 else "unauthorized")

    def _may_log_rejection(self, route: str) -> bool:
        second = int(time.monotonic())
        last_second, count = self._rejections_logged.get(route, (second, 0))
        if last_second != second:
            count = 0
        if count >= REJECTIONS_LOGGED_PER_SECOND:
            return False
        self._rejections_logged[route] = (second, count + 1)
        return True

    async def _store_rejection(self, rejection: Rejection) -> None:
        try:
            await self._store.record_rejection(rejection)
        except StoreError as error:
            log.warning("rejection on route %s not recorded: %s", rejection.route, error)


async def _read_body(request: web.BaseRequest, limit: int) -> bytes | None:
    """The raw body, or None when it is larger than `limit` (read no further).

    Each route's own limit applies, checked against Content-Length before
    reading anything, and against the bytes read for a chunked body.
    """
    length = request.content_length
    if length is not None and length > limit:
        return None
    if request.headers.get("Expect", "").lower() == "100-continue":
        # The sender (curl does this past 1 KiB) waits for this before sending
        # the body; aiohttp's low-level server does not send it on its own.
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response itself has not started (as aiohttp does)
    if length is not None:
        try:
            return await request.content.readexactly(length)
        except asyncio.IncompleteReadError:
            # The sender went away mid-body: nothing to store, nobody to answer.
            raise web.HTTPBadRequest(text="incomplete body") from None
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


def _answer(answer: Answer) -> web.Response:
    return web.Response(
        status=answer.status,
        body=answer.body,
        headers={"Content-Type": answer.content_type},
    )


def _error(status: int, message: str, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return _json(status, {"error": message}, headers)
