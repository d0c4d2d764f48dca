"""What relay makes of HTTP, over whichever transport carries it: the one
place for the header rules, the redirects followed, the classification of an
answer and its Retry-After (httpx's client over its `_transports`).

A target kind builds a `Request` and a judge (`classify`, or its own, as
Telegram's); `exchange` sends it through a transport (relay's own client,
aiohttp's) and returns one Outcome. Nothing here opens a socket: the unit
tests drive it through a whole fake transport.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from urllib.parse import quote

import orjson
from multidict import CIMultiDictProxy
from yarl import URL

from relay import __version__
from relay.core.outcome import RESPONSE_EXCERPT_BYTES, Outcome, Verdict
from relay.targets.outbound.transport import ClientError, Request, Transport

USER_AGENT = f"relay/{__version__}"

# -- header rules ---------------------------------------------------------------

# RFC 9110 section 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def is_header_name(name: str) -> bool:
    return _TOKEN.fullmatch(name) is not None


def breaks_header(value: str) -> bool:
    """Whether a header value holds what no value may: CR, LF or NUL (RFC 9110
    section 5.5)."""
    return any(char in value for char in "\r\n\0")


# Printable ASCII but "%" and the space: what stays as it is when a value is
# percent-encoded (as Jinja's `| urlencode` leaves it).
_KEPT = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) != "%")


def sendable(value: str) -> str:
    """A header value as it can go out, by one rule for every HTTP header
    relay sends (a template's output, a sender's Content-Type passed on):

    - a control character (CR, LF and NUL among them: a line break would
      end the header, and start another) becomes a space (RFC 9112 section
      5.2 reads a folded line so), a tab stays;
    - a value holding non-ASCII text (RFC 9110 section 5.5: a value is ASCII;
      other bytes are obs-text, which many servers refuse and others read as
      Latin-1) is percent-encoded as UTF-8, "%" included, so it reads back
      exactly (`| urldecode`, `decodeURIComponent`): "Анна" goes as
      "%D0%90%D0%BD%D0%BD%D0%B0".

    An ASCII value without controls, nearly every one, goes as it is."""
    if value.isascii() and value.isprintable():
        return value
    spaced = "".join(" " if _control(char) else char for char in value)
    return spaced if spaced.isascii() else quote(spaced, safe=_KEPT)


def _control(char: str) -> bool:
    return (char < " " and char != "\t") or "\x7f" <= char <= "\x9f"


def merged_headers(*layers: dict[str, str]) -> dict[str, str]:
    """Header layers, later ones winning, names compared without case (RFC
    9110 section 5.1): a later layer's `idempotency-key` replaces an earlier
    `Idempotency-Key` instead of going out beside it, and keeps its own
    spelling. Values go out by `sendable`'s rule."""
    headers: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            folded = name.lower()
            earlier = spelled.pop(folded, None)
            if earlier is not None:
                del headers[earlier]
            spelled[folded] = name
            headers[name] = sendable(value)
    return headers


# What a hop to another origin never carries (the Fetch standard's "HTTP-
# redirect fetch" drops Authorization; curl drops it and Cookie unless told
# --location-trusted): credentials meant for the origin the target names.
_ORIGIN_CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _on_the_wire(request: Request) -> Request:
    """`request` as a transport gets it: user:password in the URL becomes
    Basic Authorization (RFC 9110 section 11.2, unless one is configured) and
    leaves the URL, so every transport sends the same thing and a hop's
    credentials are decided here alone."""
    if "@" not in request.url:  # no userinfo: no URL to parse
        return request
    url = URL(request.url)
    if url.raw_user is None:
        return request
    headers = request.headers
    if not any(name.lower() == "authorization" for name in headers):
        pair = f"{url.user or ''}:{url.password or ''}".encode()
        headers = {**headers, "Authorization": "Basic " + base64.b64encode(pair).decode()}
    return replace(request, url=str(url.with_user(None)), headers=headers)


# -- redirects ------------------------------------------------------------------

# A 307 or 308 repeats the request as it was, method and body (RFC 9110
# sections 15.4.8-9); 301, 302 and 303 let clients turn a POST into a GET
# (15.4.2-4), which would deliver nothing: never followed.
_KEEPS_THE_REQUEST = (307, 308)
MAX_REDIRECTS = 5
_SHOWN_LIMIT = 300
_WILDCARDS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Follow:
    """Redirects followed: 307 and 308 to the same origin (scheme, host and
    port), or to `hosts`; never to `own`, relay's own listeners (its ingress
    and admin, host and port: a target must not make relay send to itself)."""

    hosts: tuple[str, ...] = ()
    own: tuple[tuple[str, int], ...] = ()


def origin(url: URL) -> tuple[str, str, int]:
    """(scheme, host, port): what "the same host" means (RFC 6454's origin)."""
    host = (url.host or "").lower().rstrip(".")
    return (url.scheme, host, url.port or (443 if url.scheme == "https" else 80))


def _same_origin(current: URL, moved: URL) -> bool:
    here, there = origin(current), origin(moved)
    if here == there:
        return True
    # http://crm to https://crm on the default ports is the same server moved
    # to TLS (httpx keeps its credentials so): nothing leaves for anyone else.
    return here == ("http", there[1], 80) and there == ("https", here[1], 443)


async def _is_own(host: str, port: int, own: Iterable[tuple[str, int]]) -> bool:
    """Whether host:port reaches one of relay's own listeners: the same port
    on an address of this machine the listener takes (its own address, or any
    local one when it listens on all of them). A name is looked up: that it
    says "localhost" or "crm.example" decides nothing, its addresses do."""
    listening = [listen_host for listen_host, listen_port in own if listen_port == port]
    if not listening:
        return False
    for address in await _addresses(host, port):
        parsed = ipaddress.ip_address(address)
        # A connection to 0.0.0.0 or :: ("this host") reaches the machine's
        # listeners as one to loopback does.
        loopback = parsed.is_loopback or parsed.is_unspecified
        for listen_host in listening:
            if address == listen_host.strip("[]"):
                return True
            if (loopback or listen_host in _WILDCARDS) and _local(address):
                return True
    return False


async def _addresses(host: str, port: int) -> list[str]:
    bare = host.strip("[]").partition("%")[0]
    try:
        return [str(ipaddress.ip_address(bare))]
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            bare, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError:
        return []  # no address: the transport will say the name did not resolve
    return [str(ipaddress.ip_address(str(where[0]).partition("%")[0])) for *_, where in found]


def _local(address: str) -> bool:
    """An address of this machine: loopback, unspecified, or one a socket can
    be bound to (the kernel says so; nothing is sent)."""
    parsed = ipaddress.ip_address(address)
    if parsed.is_loopback or parsed.is_unspecified:
        return True
    family = socket.AF_INET6 if parsed.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _shown(url: URL) -> str:
    """A URL as an error shows it: never its password, never longer than a line."""
    try:
        shown = str(url.with_user(None))
    except ValueError:  # yarl: no user to replace in a URL without a host (file:///...)
        shown = str(url)
    return shown if len(shown) <= _SHOWN_LIMIT else shown[: _SHOWN_LIMIT - 1] + "…"


async def _redirect(
    request: Request, location: str | None, status: int, follow: Follow | None
) -> Request | str:
    """The request a redirect is followed with, or why it is not: where it
    pointed and what to change in the config (the delivery is dead: a person
    decides). Never raises: any Location is a one-line reason at worst."""
    if not location or not location.strip():
        return f"HTTP {status} without a Location: a redirect to nowhere"
    try:
        current = URL(request.url)
        moved = current.join(URL(location.strip()))
        str(moved)
    except (ValueError, TypeError, UnicodeError):
        return f"HTTP {status} to a Location that is not a URL"
    said = f"HTTP {status} to {_shown(moved)}"
    if moved.scheme not in ("http", "https") or not moved.host:
        return f"{said}: not an http(s) URL, never followed"
    if status in (301, 302, 303):
        return (
            f"{said}: not followed ({status} may turn a POST into a GET);"
            " if the target moved, set its url to this one"
        )
    if follow is None or status not in _KEEPS_THE_REQUEST:
        return (
            f"{said}: redirects are not followed; if the target moved, set its url to"
            " this one, or set follow_redirects = true"
        )
    if current.scheme == "https" and moved.scheme == "http":
        return f"{said}: from https to http, never followed"
    same = _same_origin(current, moved)
    if not same and origin(moved)[1] not in follow.hosts:
        return (
            f"{said}: another origin (scheme, host and port), not followed unless its host"
            " is listed in redirect_hosts"
        )
    if await _is_own(moved.host or "", origin(moved)[2], follow.own):
        return f"{said}: one of relay's own listeners, never followed"
    headers = request.headers
    if same:
        # user:password written in the url goes on to the same origin only.
        if current.raw_user is not None and moved.raw_user is None:
            moved = moved.with_user(current.user).with_password(current.password)
    else:
        moved = moved.with_user(None)
        headers = {k: v for k, v in headers.items() if k.lower() not in _ORIGIN_CREDENTIALS}
    return replace(request, url=str(moved), headers=headers)


# -- one exchange -----------------------------------------------------------------

Judge = Callable[[int, CIMultiDictProxy[str], bytes], Outcome]


async def exchange(
    transport: Transport,
    prepared: Request,
    judge: Judge,
    paced: Callable[[], Awaitable[None]] | None = None,
    *,
    body_by: Callable[[], float] | None = None,
    follow: Follow | None = None,
) -> Outcome:
    """Send a request; network trouble is a retry (ClientError says which),
    the answer goes to `judge`. A redirect is followed only as `follow`
    allows; compressed answers are not asked for. `paced` (Envelope.paced)
    is awaited with the connection open, right before the first request is
    written; the hops of a redirect are one request, one turn."""
    for _ in range(MAX_REDIRECTS + 1):
        try:
            answer = await transport.send(
                _on_the_wire(prepared),
                keep=RESPONSE_EXCERPT_BYTES,
                body_by=body_by,
                before_write=paced,
            )
            paced = None
        except ClientError as error:
            return Outcome.retry(str(error)) if error.retryable else Outcome.fail(str(error))
        status = answer.status
        if 300 <= status < 400:
            moved = await _redirect(prepared, answer.headers.get("Location"), status, follow)
            if isinstance(moved, str):
                return Outcome.fail(moved, status, answer.excerpt)
            prepared = moved
            continue
        outcome = judge(status, answer.headers, answer.excerpt)
        if not answer.whole and outcome.verdict is Verdict.SUCCESS:
            # The status came: the target took the request. Waiting out the
            # body would make the attempt a timeout, and a retry deliver it again.
            return replace(outcome, error=f"HTTP {status}; its body stopped coming, kept as sent")
        return outcome
    return Outcome.fail(
        f"more than {MAX_REDIRECTS} redirects, the last to {_shown(URL(prepared.url))}"
    )


# -- what an answer means -----------------------------------------------------------


def classify(
    status: int,
    headers: CIMultiDictProxy[str],
    excerpt: bytes,
    temporary: frozenset[int] = frozenset(),
) -> Outcome:
    """An HTTP target's answer as design says: 2xx delivered; 5xx retried;
    429, a status the target declares `temporary` (amoCRM's 403 while it
    blocks an address) and Bitrix24's QUERY_LIMIT_EXCEEDED (a 503) are a
    throttle: retried, the whole target held (relay.delivery.step, rule 4);
    a Retry-After honoured; anything else dead."""
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    reason = f"HTTP {status}"
    said = answer_says(excerpt)
    if said:
        reason += f": {said}"
    if status == 429 or status >= 500 or status in temporary:
        retry_after = parse_retry_after(headers.get("Retry-After"))
        throttle = status == 429 or status in temporary or _query_limit(status, excerpt)
        return Outcome.retry(reason, status, excerpt, retry_after, throttle=throttle)
    return Outcome.fail(reason, status, excerpt)


def _query_limit(status: int, excerpt: bytes) -> bool:
    """Bitrix24's rate limit: a 503 whose JSON says {"error":
    "QUERY_LIMIT_EXCEEDED"} (apidocs.bitrix24.com, "REST API limits": past
    its leaky bucket's threshold every request is refused so)."""
    if status != 503 or b"QUERY_LIMIT_EXCEEDED" not in excerpt:
        return False
    try:
        answer = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("error") == "QUERY_LIMIT_EXCEEDED"


# Where JSON APIs put their reason: Bitrix24 ({"error": "...", "error_description":
# "..."}), RetailCRM ({"success": false, "errorMsg": "...", "errors": {...}}),
# OAuth-style and most CRMs (error_description, message, detail).
_REASON_KEYS = ("errorMsg", "error_description", "message", "detail", "description", "error")
_REASON_LIMIT = 300
_DETAILS = 3  # field errors said, at most


def answer_says(excerpt: bytes) -> str:
    """The reason a JSON error answer gives, on one short line ("" if none).

    A person reading `relay stats`, an alert or the attempt log should see the
    CRM's "Phone is not valid", not only "HTTP 400"; a form's field errors
    (RetailCRM's `errors`, amoCRM's `validation-errors`) say which field."""
    try:
        answer = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(answer, dict):
        return ""
    reason = next(
        (v for k in _REASON_KEYS if isinstance(v := answer.get(k), str) and v.strip()), ""
    )
    fields = _field_errors(answer)
    line = " ".join(f"{reason} ({fields})".split()) if fields else " ".join(reason.split())
    if line.startswith("(") and line.endswith(")"):
        line = line[1:-1]
    return line if len(line) <= _REASON_LIMIT else line[: _REASON_LIMIT - 1] + "…"


def _field_errors(answer: dict[str, object]) -> str:
    """ "field: problem" pairs, the first few: RetailCRM's `errors` object
    ({"externalId": "..."}) and amoCRM's `validation-errors` (its
    developers' "List of API errors": [{"errors": [{"path", "detail"}]}])."""
    said: list[str] = []
    errors = answer.get("errors")
    if isinstance(errors, dict):
        said += [f"{k}: {v}" for k, v in errors.items() if isinstance(v, str)]
    elif isinstance(errors, list):
        said += [v for v in errors if isinstance(v, str)]
    requests = answer.get("validation-errors")
    for request in requests if isinstance(requests, list) else ():
        inner = request.get("errors") if isinstance(request, dict) else None
        for error in inner if isinstance(inner, list) else ():
            if isinstance(error, dict) and isinstance(error.get("detail"), str):
                path = error.get("path")
                said.append(f"{path}: {error['detail']}" if path else str(error["detail"]))
    return "; ".join(said[:_DETAILS]) + (
        f"; {len(said) - _DETAILS} more" if len(said) > _DETAILS else ""
    )


# Past this a Retry-After is read as this: the scheduler caps a wait far
# lower (relay.delivery.retry), and a number of thousands of digits must not
# become float("inf") on the way there.
RETRY_AFTER_LIMIT = 365 * 24 * 3600.0
# An HTTP date is 29 characters (IMF-fixdate), its obsolete forms a few more.
_DATE_LIMIT = 64


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date
    (RFC 9110 section 10.2.3); None for anything else, which leaves the
    normal backoff (a header that cannot be read is no reason to lose the
    answer's status)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²": str.isdigit takes it, float() not
        digits = value.lstrip("0") or "0"
        return RETRY_AFTER_LIMIT if len(digits) > 12 else min(float(digits), RETRY_AFTER_LIMIT)
    if len(value) > _DATE_LIMIT:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
    return min(max(0.0, when - (now if now is not None else time.time())), RETRY_AFTER_LIMIT)
