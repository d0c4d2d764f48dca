"""The public listener: take a webhook, put it on disk, and only then say 200.

Nothing slow happens here: match the route, bound the body, work out the
idempotency key, hand the event to the store's group commit, answer from
that commit's outcome. The HTTP framing is relay.ingress.http1's; a request is
admitted on its head (`Ingress.admit`: route, method, size, encoding) and
answered by its `Webhook` once its body is in and, for an event, once the
transaction holding it is done: a callback on the commit's future, no task
per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from relay.config import Answer, Config, RouteConfig
from relay.core.budget import one_budget
from relay.core.clock import Clock
from relay.core.incoming import Incoming
from relay.core.netaddr import Network, client_address, within
from relay.core.outage_log import OutageLog
from relay.core.payload import Payload
from relay.core.secrets import Masker
from relay.core.units import format_duration
from relay.ingress.encoding import ACCEPT_ENCODING, BadEncoding, BodyTooLarge, coding_of, inflate
from relay.ingress.http1 import Head, Http1Server, Response
from relay.ingress.plan import idempotency_key, plan_deliveries
from relay.kinds.source import Ping, Reject, Source
from relay.loader.registry import build_source
from relay.ops.metrics import Metrics
from relay.store import Accepted, Intake, NewEvent, Rejection, StoreError

log = logging.getLogger("relay.ingress")


class IngressStore(Intake, Protocol):
    """Ingress stores events and refusals."""


MAX_KEY_LENGTH = 512
# Seconds a sender is asked to wait after a 503: long enough for a full disk
# or a lock to clear, short enough to fit Tilda's 5 s window on a retry.
RETRY_AFTER_SECONDS = 5
# At most this many rejections a second per route are written down; a flood
# of forged requests is counted in the metrics but cannot flood the disk.
REJECTIONS_LOGGED_PER_SECOND = 10
# Body bytes all requests together may hold while they are received and
# stored (at least four of the largest route's bodies): stalled uploads must
# not hold memory without bound; past this the sender gets 503 and Retry-After.
BODIES_IN_FLIGHT = 64 * 1024 * 1024

# Compressed bodies are inflated on this one thread, never on the loop:
# inflating up to a route's max_body_size is work a sender chooses, and
# zlib lets go of the GIL while it inflates. One thread: senders of
# compressed bodies wait for each other, never the others.
_INFLATER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relay-inflate")


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
    max_body_size: int  # the largest any route takes


class Ingress:
    def __init__(
        self,
        config: Config,
        store: IngressStore,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        on_accepted: Callable[[str], None] = lambda route: None,  # the route's name
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics or Metrics()
        self._on_accepted = on_accepted
        self._rejections_logged: dict[str, tuple[int, int]] = {}
        self._unlogged: dict[str, int] = {}  # refused since the route's last line
        # Events not stored, each answered 503 (its failures).
        self._not_storing = OutageLog()
        self._counters = self._metrics.ingress
        self._background: set[asyncio.Task[None]] = set()
        self.bodies_in_flight = 0
        self._bodies_by_address: dict[str | None, int] = {}  # of bodies_in_flight
        self.bodies_peak = 0  # the most held at once since relay.background.memory last looked
        self._http: Http1Server | None = None
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        # One assignment: a request sees either the old routes or the new ones.
        largest = max((route.max_body_size for route in config.routes.values()), default=0)
        self._settings = _Settings(
            routes={
                route.path: _Route(route, build_source(route), route.templated)
                for route in config.routes.values()
            },
            trusted_proxies=config.server.trusted_proxies,
            masker=config.masker,
            read_timeout=config.server.read_timeout,
            bodies_in_flight_limit=max(BODIES_IN_FLIGHT, 4 * largest),
            max_body_size=largest,
        )
        if self._http is not None:
            self._http.timeout = config.server.read_timeout

    async def close(self) -> None:
        """Wait for rejections still being written down."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def server(self) -> Http1Server:
        """The listener's protocol factory (relay.ingress.http1).

        A connection has read_timeout to send a request's head (from the
        moment it opens, or its previous answer), and an admitted request
        as long again for its body: one that sends nothing or half a header
        must not hold a descriptor for a minute.
        """
        if self._http is None:
            self._http = Http1Server(
                self,
                timeout=self._settings.read_timeout,
                max_body=lambda: self._settings.max_body_size,
            )
        return self._http

    def admit(self, head: Head) -> Webhook | Response:
        """A request on its head: refused now, or admitted with its route's body limit."""
        started = time.perf_counter()
        settings = self._settings
        bundle = settings.routes.get(head.path)
        if bundle is None:
            # The path is not a label: unknown paths must not grow the metrics.
            self.count("", "not_found")
            return _error(404, "no route for this path")
        route = bundle.config
        headers = head.headers
        if settings.trusted_proxies:
            remote = client_address(
                head.remote, headers.get("X-Forwarded-For"), settings.trusted_proxies
            )
        else:
            remote = head.remote
        # Memory for bodies being received is bounded: each request holds its
        # declared length (or its route's limit when chunked) until answered.
        # One address holds at most half of it: uploads that stall, sent
        # before any credential is checked, cannot shut out other senders.
        length = head.content_length
        held = route.max_body_size if length is None else min(length, route.max_body_size)
        limit = settings.bodies_in_flight_limit
        its_own = self._bodies_by_address.get(remote, 0)
        if self.bodies_in_flight + held > limit or its_own + held > limit // 2:
            self.count(route.name, "busy")
            return _error(
                503,
                "too many bodies being received at once",
                headers=(("Retry-After", str(RETRY_AFTER_SECONDS)),),
            )
        if route.allow_ips and not within(remote, route.allow_ips):
            return self.reject(
                route,
                head,
                remote,
                settings.masker,
                Reject("ip_not_allowed", f"{remote} is not in allow_ips"),
                403,
            )
        if head.method != "POST":
            self.count(route.name, "method_not_allowed")
            return _error(405, "only POST is accepted here", headers=(("Allow", "POST"),))
        encoding = headers.get("Content-Encoding")
        if encoding is not None:
            # Every line of it: two lines are one list (RFC 9110 section 5.3),
            # and a coding left out would be stored still compressed.
            encoding = ",".join(headers.getall("Content-Encoding"))
        coding = coding_of(encoding)
        if coding is None:
            self.count(route.name, "unsupported_encoding")
            return _error(
                415,
                f"Content-Encoding must be one of {ACCEPT_ENCODING}, or none",
                headers=(("Accept-Encoding", ACCEPT_ENCODING),),
            )
        if length is not None and length > route.max_body_size:
            self.count(route.name, "too_large")
            return _error(413, f"body larger than {route.max_body_size} bytes")
        self.bodies_in_flight += held
        self._bodies_by_address[remote] = its_own + held
        self.bodies_peak = max(self.bodies_peak, self.bodies_in_flight)
        return Webhook(self, bundle, settings, head, remote, coding, held, started)

    def _released(self, remote: str | None, held: int) -> None:
        self.bodies_in_flight -= held
        left = self._bodies_by_address.pop(remote, 0) - held
        if left > 0:
            self._bodies_by_address[remote] = left

    def count(self, route: str, result: str) -> None:
        self._counters.count(route, result)

    def stored(self, route: RouteConfig, event: NewEvent, accepted: Accepted) -> None:
        """An event's transaction is done: conflicts said, arrivals told."""
        refused = self._not_storing.failures  # read first: a cheap test per webhook
        lasted = self._not_storing.ended(self._clock.now()) if refused else None
        if lasted is not None:
            log.warning(
                "events are stored again, after %s: %d answered 503 meanwhile (their senders"
                " send them again)",
                format_duration(lasted),
                refused,
            )
        if accepted.conflict_of is not None:
            self._key_conflict(route, event, accepted)
        if not accepted.duplicate and not accepted.refused:
            self._on_accepted(route.name)

    def not_stored(self, route: str, error: StoreError) -> None:
        """An event its store did not take: answered 503. One line when events
        stop being stored, one a minute while they are not, one when they are
        again (stored): a database restart answered hundreds of webhooks 503,
        and a line each buried what happened in the journal."""
        now = self._clock.now()
        outage = self._not_storing
        if not outage.failed(now):
            log.debug("route %s: event not stored, answering 503: %s", route, error)
        elif outage.failures == 1:
            log.error(
                "events cannot be stored, answering 503 with Retry-After until they can:"
                " route %s: %s",
                route,
                error,
            )
        else:
            log.error(
                "events still cannot be stored, for %s (%d answered 503): route %s: %s",
                format_duration(outage.lasted(now)),
                outage.failures,
                route,
                error,
            )

    def observe_ack(self, seconds: float) -> None:
        self._counters.observe_ack(seconds)

    @property
    def store(self) -> IngressStore:
        return self._store

    @property
    def clock(self) -> Clock:
        return self._clock

    def _key_conflict(self, route: RouteConfig, event: NewEvent, accepted: Accepted) -> None:
        self._metrics.key_conflicts.labels(route.name).inc()
        if accepted.refused:
            self.count(route.name, "key_conflict")
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

    def reject(
        self,
        route: RouteConfig,
        head: Head,
        remote: str | None,
        masker: Masker,
        rejection: Reject,
        status: int,
    ) -> Response:
        self.count(route.name, "rejected")
        self._metrics.rejected.labels(route.name, rejection.reason).inc()
        # Written down (a log line and a stored rejection) at most
        # REJECTIONS_LOGGED_PER_SECOND a second per route: a flood of forged
        # requests would exhaust journald's rate limit, relay's attempt lines
        # with it. The metrics count every one.
        if not self._may_log_rejection(route.name):
            self._unlogged[route.name] = self._unlogged.get(route.name, 0) + 1
        else:
            left_out = self._unlogged.pop(route.name, 0)
            log.warning(
                "route %s: refused a request from %s: %s%s%s",
                route.name,
                remote,
                rejection.reason,
                f" ({rejection.detail})" if rejection.detail else "",
                f" ({left_out} more refused on this route, not logged)" if left_out else "",
            )
            record = Rejection(
                route=route.name,
                at=self._clock.now(),
                remote_addr=remote,
                reason=rejection.reason,
                detail=masker.text(rejection.detail),
                headers=masker.headers(head.fields),
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


class Webhook:
    """One admitted request (relay.ingress.http1's Exchange): verified, keyed and
    stored once its body is in; answered from its transaction's outcome."""

    __slots__ = (
        "_bundle",
        "_coding",
        "_event",
        "_head",
        "_ingress",
        "_remote",
        "_settings",
        "_started",
        "held",
        "limit",
    )

    def __init__(
        self,
        ingress: Ingress,
        bundle: _Route,
        settings: _Settings,
        head: Head,
        remote: str | None,
        coding: str,
        held: int,
        started: float,
    ) -> None:
        self._ingress = ingress
        self._bundle = bundle
        self._settings = settings
        self._head = head
        self._remote = remote
        self._coding = coding
        self.held = held
        self.limit = bundle.config.max_body_size
        self._started = started
        self._event: NewEvent | None = None

    def refused(self, status: int) -> None:
        self._ingress.count(self._bundle.config.name, "too_large" if status == 413 else "timeout")

    def release(self) -> None:
        self._ingress._released(self._remote, self.held)

    def answer(self, body: bytes) -> Response | asyncio.Future[Any]:
        if self._coding:
            return asyncio.ensure_future(self._inflated(body))
        return self._budgeted(body)

    def _budgeted(self, body: bytes) -> Response | asyncio.Future[Any]:
        if self._bundle.templated:
            with one_budget():  # the request's templates together: LOOP_SECONDS at most
                return self._answer(body)
        # Nothing to budget, and a budget costs as much as the route lookup.
        return self._answer(body)

    async def _inflated(self, body: bytes) -> Response | Accepted:
        """A compressed body, inflated off the loop, then answered as any other
        (`settle` takes the Response this may give instead of an Accepted)."""
        route = self._bundle.config
        loop = asyncio.get_running_loop()
        try:
            body = await loop.run_in_executor(
                _INFLATER, inflate, self._coding, body, route.max_body_size
            )
        except BodyTooLarge:
            self._ingress.count(route.name, "too_large")
            return _error(413, f"body larger than {route.max_body_size} bytes")
        except BadEncoding as error:
            self._ingress.count(route.name, "bad_request")
            return _error(400, f"body is not valid {self._coding}: {error}")
        answered = self._budgeted(body)
        if isinstance(answered, Response):
            return answered
        result: Accepted = await answered
        return result

    def _answer(self, body: bytes) -> Response | asyncio.Future[Any]:
        ingress = self._ingress
        bundle = self._bundle
        route = bundle.config
        head = self._head
        headers = head.headers
        payload = Payload(
            method=head.method,
            path=head.path,
            query=head.query,
            headers=head.fields,
            content_type=headers.get("Content-Type"),
            body=body,
        )
        incoming = Incoming(payload, self._remote, header_view=headers)
        now = ingress.clock.now()
        check = bundle.source.check(incoming, now)
        if isinstance(check, Ping):
            ingress.count(route.name, "ping")
            return _answer(check.answer)
        if isinstance(check, Reject):
            return ingress.reject(route, head, self._remote, self._settings.masker, check, 401)
        key = idempotency_key(route, incoming, check.key)
        if key is not None and len(key) > MAX_KEY_LENGTH:
            ingress.count(route.name, "bad_request")
            return _error(400, f"idempotency key longer than {MAX_KEY_LENGTH} characters")
        if key is None and route.require_idempotency_key:
            ingress.count(route.name, "bad_request")
            return _error(400, "this route requires an idempotency key")
        event = NewEvent(
            route=route.name,
            idempotency_key=key,
            received_at=now,
            remote_addr=self._remote,
            payload=payload.as_stored(),
        )
        deliveries = plan_deliveries(route, incoming)
        # (A store refuses to acknowledge into a deleted or replaced database
        # file itself, once per group commit: Health.file_problem.)
        try:
            stored = ingress.store.accept_event(
                event, deliveries, now, refuse_conflict=route.key_conflict == "reject"
            )
        except StoreError as error:
            return self._not_stored(error)
        self._event = event
        return stored

    def settle(self, done: asyncio.Future[Any]) -> Response:
        ingress = self._ingress
        route = self._bundle.config
        try:
            accepted: Accepted | Response = done.result()
        except StoreError as error:
            return self._not_stored(error)
        except asyncio.CancelledError:  # the store closed with the event in its queue
            return self._not_stored(StoreError("the store closed"))
        if isinstance(accepted, Response):  # a compressed body, answered when inflated
            return accepted
        event = self._event
        assert event is not None
        ingress.stored(route, event, accepted)
        if accepted.refused:
            return _error(
                422,
                f"idempotency key {event.idempotency_key!r} was already used for event"
                f" {accepted.conflict_of} with a different payload",
            )
        status = "duplicate" if accepted.duplicate else "queued"
        ingress.count(route.name, status)
        ingress.observe_ack(time.perf_counter() - self._started)
        answer = route.response or self._bundle.source.answer
        if answer is not None:
            return _answer(answer)
        return Response(200, b'{"status":"%s","id":"%d"}' % (status.encode(), accepted.event_id))

    def _not_stored(self, error: StoreError) -> Response:
        route = self._bundle.config
        self._ingress.not_stored(route.name, error)
        self._ingress.count(route.name, "unavailable")
        return _unavailable()


_RETRY_LATER = (("Retry-After", str(RETRY_AFTER_SECONDS)),)


def _unavailable() -> Response:
    return _error(503, "cannot store the event now", headers=_RETRY_LATER)


_NO_CONTENT = Response(204, b"", None)


def _answer(answer: Answer) -> Response:
    if answer.status == 204:  # no content, whatever the route's body says (RFC 9110 15.3.5)
        return _NO_CONTENT
    return Response(answer.status, answer.body, answer.content_type)


def _error(status: int, message: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, orjson.dumps({"error": message}), "application/json", headers)
