"""Guessing the admin token, slowed down: per client address, failed sign-ins
and failed bearer checks are counted, and past a limit every further try from
that address — right or wrong — gets 429 until the window has passed."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque

from aiohttp import web

log = logging.getLogger("relay.admin")

WINDOW = 60.0
LIMIT = 10
# Addresses remembered at most: a flood from many addresses cannot grow memory.
MAX_ADDRESSES = 10_000


class AuthFailures:
    def __init__(self, *, limit: int = LIMIT, window: float = WINDOW) -> None:
        self._limit = limit
        self._window = window
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self._window:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def retry_after(self, address: str, now: float | None = None) -> float | None:
        """Seconds until `address` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        times = self._recent(address, now)
        if len(times) < self._limit:
            return None
        return max(times[0] + self._window - now, 1.0)

    def failed(self, address: str, what: str, now: float | None = None) -> None:
        """Count a failure and log it in one line (not the value that was tried)."""
        now = time.monotonic() if now is None else now
        times = self._recent(address, now)
        if not times:
            self._failures[address] = times
            while len(self._failures) > MAX_ADDRESSES:
                self._failures.popitem(last=False)
        times.append(now)
        self._failures.move_to_end(address)
        if len(times) == self._limit:
            log.warning(
                "%s from %s: %d failures in %gs, refusing it for a while",
                what,
                address,
                len(times),
                self._window,
            )
        elif len(times) < self._limit:
            log.warning("%s from %s", what, address)


def client(request: web.Request) -> str:
    return request.remote or "unknown"


def too_many(retry_after: float) -> web.Response:
    return web.Response(
        status=429,
        text="Too many failed attempts from this address: try again later.",
        headers={"Retry-After": str(int(retry_after + 0.999)), "Cache-Control": "no-store"},
    )


AUTH_FAILURES = web.AppKey("auth_failures", AuthFailures)
