"""Only this operator's own tools may use the admin listener, not any web page
they happen to visit.

A page on another site can make the operator's browser send requests to
127.0.0.1: a `no-cors` POST with a form or text body, or — after DNS
rebinding, where the attacker's name resolves to 127.0.0.1 — any request, with
the answer readable, carrying `Host: evil.example`. So, for every request:

- `Host` must be a name of this listener: an IP address (a page can only send
  one when it was itself loaded from that address), `localhost`, or one of
  `admin.allowed_hosts` (a name a reverse proxy passes on). Else 421.
- A request that changes something (any method but GET, HEAD, OPTIONS) must
  not come from another origin: `Origin`, when sent, must be this host (or an
  allowed name), and `Sec-Fetch-Site`, when sent, must be `same-origin` or
  `none`. Else 403. (curl and scripts send neither.)

And an API write must say `Content-Type: application/json` (checked by the
API's own guard, after the token): a browser only sends that cross-site after
a CORS preflight, which relay never grants. Else 415.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from relay.admin.console import CONSOLE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _hostname(authority: str) -> str:
    """The host of `host[:port]` or `[v6]:port`, lower case, without a trailing dot."""
    if authority.startswith("["):
        return authority[1 : authority.find("]")].lower() if "]" in authority else ""
    host = authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority
    return host.lower().rstrip(".")


def host_allowed(authority: str, allowed: frozenset[str]) -> bool:
    host = _hostname(authority)
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost") or host in allowed:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _refuse(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"error": message}),
        content_type="application/json",
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def cross_origin_problem(request: web.Request, allowed: frozenset[str]) -> str | None:
    host = request.headers.get("Host", "")
    origin = request.headers.get("Origin")
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if origin == "null" and fetch_site == "same-origin":
        # A browser hides the origin under a no-referrer policy; its fetch
        # metadata (which a page cannot set) still says where the request is from.
        origin = None
    if origin is not None:
        parts = urlsplit(origin)
        same = parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()
        if not same and _hostname(parts.netloc) not in allowed:
            return f"a change requested from another origin ({origin[:100]}) is refused"
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"a change requested by a {fetch_site} page is refused"
    return None


@web.middleware
async def origin_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    allowed = request.config_dict[CONSOLE].config.admin.allowed_hosts
    host = request.headers.get("Host")
    if host is not None and not host_allowed(host, allowed):
        return _refuse(
            421,
            f"Host {host[:100]!r} is not a name of this admin listener;"
            " a name a proxy uses goes in admin.allowed_hosts",
        )
    if request.method not in SAFE_METHODS:
        problem = cross_origin_problem(request, allowed)
        if problem is not None:
            return _refuse(403, problem)
    return await handler(request)
