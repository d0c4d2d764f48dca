"""The `http` target: a CRM API or any URL. Forwards the body as it came, or
builds a JSON or form body from templates; classifies the answer."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, urlencode

import orjson
from multidict import CIMultiDictProxy
from yarl import URL

from relay import __version__
from relay.budget import TemplateError
from relay.httpclient import ENVIRONMENT, Client, ClientError, Proxy
from relay.kinds.targets.http import HttpSettings, Outbound, breaks_header
from relay.outcome import RESPONSE_EXCERPT_BYTES, Outcome, Verdict
from relay.secrets import Masker
from relay.signing import signature_headers, webhook_id
from relay.targets.base import (
    Envelope,
    context,
    relay_headers,
    render_map,
    rendered,
    variables,
)

USER_AGENT = f"relay/{__version__}"


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes

    def describe(self, *, wire: bool = False) -> str:
        """For display (`relay render`): credential headers are masked. A form
        body shows its fields decoded, one a line, unless `wire` asks for the
        bytes that go out."""
        masker = Masker()
        lines = [f"{self.method} {masker.text(self.url)}"]
        lines += [f"{name}: {masker.header(name, value)}" for name, value in self.headers.items()]
        form = self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded")
        if form and not wire:
            fields = parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True)
            lines += ["", "form fields (decoded; --wire shows the encoded body):"]
            lines += [f"  {name} = {value}" for name, value in fields]
        else:
            lines += ["", self.body.decode("utf-8", errors="replace")]
        return "\n".join(lines)


class SessionOwner:
    """A target that sends over its own kept-alive connections, opened by `start`."""

    def __init__(self, concurrency: int, outbound: Outbound | None = None) -> None:
        self._concurrency = concurrency
        self._outbound = outbound or Outbound()
        self._client: Client | None = None

    async def start(self) -> None:
        outbound = self._outbound
        proxy: Proxy | str | None = ENVIRONMENT
        if outbound.proxy == "none":
            proxy = None
        elif outbound.proxy is not None:
            proxy = Proxy.parse(outbound.proxy)
        # As many idle connections kept as attempts may run at once.
        self._client = Client(keep=self._concurrency, tls=outbound.tls_context(), proxy=proxy)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def session(self) -> Client:
        assert self._client is not None, "target not started"
        return self._client


class HttpTarget(SessionOwner):
    def __init__(self, name: str, settings: HttpSettings, *, concurrency: int) -> None:
        super().__init__(concurrency, settings.outbound)
        self.name = name
        self._settings = settings
        self._wanted = variables(
            [*settings.headers.values(), settings.body, *settings.form.values()]
        )

    def prepare(self, envelope: Envelope) -> Request:
        """The request to send; raises TemplateError when a template fails for this event."""
        settings = self._settings
        values = context(envelope, self._wanted) if self._wanted else {}
        headers = {"User-Agent": USER_AGENT, **header_values(render_map(settings.headers, values))}
        if settings.format == "json":
            assert settings.body is not None
            body = settings.body.render(values).encode()
            try:
                orjson.loads(body)
            except orjson.JSONDecodeError as error:
                raise TemplateError(f"body template did not produce valid JSON: {error}") from None
            headers["Content-Type"] = "application/json"
        elif settings.format == "form":
            body = urlencode(render_map(settings.form, values)).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            body = envelope.payload.body
            if envelope.payload.content_type:
                headers["Content-Type"] = envelope.payload.content_type
        headers.update(relay_headers(envelope))
        if settings.sign:
            # Last: the signature covers the body exactly as it goes out.
            message_id = webhook_id(envelope.delivery_id, envelope.message_tag)
            headers.update(signature_headers(settings.sign, message_id, envelope.sent_at, body))
        return Request(settings.method, settings.url, headers, body)

    def preview(self, envelope: Envelope, *, wire: bool = False) -> str:
        return self.prepare(envelope).describe(wire=wire)

    async def send(self, envelope: Envelope) -> Outcome:
        session = self.session
        try:
            # Rendered in a worker thread: a heavy template (a loop over a large
            # payload) holds this delivery, not the event loop (relay/sandbox.py).
            prepared = await rendered(self.prepare, envelope, self._wanted)
        except TemplateError as error:
            return Outcome.unsendable(str(error))
        settings = self._settings
        return await exchange(
            session,
            prepared,
            classify,
            envelope.paced,
            body_by=envelope.answer_by,
            follow=Follow(settings.redirect_hosts) if settings.follow_redirects else None,
        )


def header_values(rendered: dict[str, str]) -> dict[str, str]:
    """Rendered header values, refused when one cannot be a header (a line
    break from the payload, a non-ASCII character), with the name of the
    header and the reason."""
    for name, value in rendered.items():
        if breaks_header(value):
            raise TemplateError(
                f"header {name}: the template's output contains a line break or NUL,"
                " which a header value cannot hold"
            )
        if not value.isascii():
            # RFC 9110 section 5.5: field values are ASCII; anything else is
            # obs-text, refused by many servers and read as Latin-1 by others
            # (httpx refuses it too). Not guessed at: the person chooses.
            raise TemplateError(
                f"header {name}: the template's output holds non-ASCII text, which a header"
                " cannot carry as such: encode it in the template (| urlencode) or send it"
                " in the body"
            )
    return rendered


# A 307 or 308 repeats the request as it was, method and body (RFC 9110
# sections 15.4.8-9); 301, 302 and 303 let clients turn a POST into a GET
# (15.4.2-4), which would deliver nothing: never followed.
_KEEPS_THE_REQUEST = (307, 308)
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class Follow:
    """Redirects followed: 307 and 308, to the same host or these."""

    hosts: tuple[str, ...] = ()


async def exchange(
    session: Client,
    prepared: Request,
    judge: Callable[[int, CIMultiDictProxy[str], bytes], Outcome],
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
            answer = await session.request(
                prepared.method,
                prepared.url,
                prepared.headers,
                prepared.body,
                keep=RESPONSE_EXCERPT_BYTES,
                body_by=body_by,
                before_write=paced,
            )
            paced = None
        except ClientError as error:
            return Outcome.retry(str(error)) if error.retryable else Outcome.fail(str(error))
        status = answer.status
        if 300 <= status < 400:
            where = answer.headers.get("Location")
            moved = _redirect(prepared.url, where, status, follow)
            if isinstance(moved, str):
                return Outcome.fail(moved, status, answer.excerpt)
            prepared = replace(prepared, url=str(moved))
            continue
        outcome = judge(status, answer.headers, answer.excerpt)
        if not answer.whole and outcome.verdict is Verdict.SUCCESS:
            # The status came: the target took the request. Waiting out the
            # body would make the attempt a timeout, and a retry deliver it again.
            return replace(outcome, error=f"HTTP {status}; its body stopped coming, kept as sent")
        return outcome
    return Outcome.fail(f"more than {MAX_REDIRECTS} redirects, the last to {prepared.url}")


def _redirect(url: str, location: str | None, status: int, follow: Follow | None) -> URL | str:
    """The URL a redirect is followed to, or why it is not: where it pointed
    and what to change in the config (the delivery is dead: a person decides)."""
    if not location or not location.strip():
        return f"HTTP {status} without a Location: a redirect to nowhere"
    try:
        current = URL(url)
        moved = current.join(URL(location.strip()))
    except (ValueError, TypeError):
        return f"HTTP {status} to a Location that is not a URL"
    shown = str(moved.with_user(None))  # never a password, were one in it
    if len(shown) > _SHOWN_LIMIT:
        shown = shown[: _SHOWN_LIMIT - 1] + "…"
    said = f"HTTP {status} to {shown}"
    if moved.scheme not in ("http", "https") or not moved.host:
        return f"{said}: not an http(s) URL"
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
    host = (moved.host or "").lower()
    if host != (current.host or "").lower() and host not in follow.hosts:
        return f"{said}: another host, not followed unless listed in redirect_hosts"
    if current.scheme == "https" and moved.scheme == "http":
        return f"{said}: from https to http, never followed"
    if current.user is not None and moved.user is None and moved.host == current.host:
        # Basic credentials written in the url go on to the same host.
        moved = moved.with_user(current.user).with_password(current.password)
    return moved


_SHOWN_LIMIT = 300


def classify(status: int, headers: CIMultiDictProxy[str], excerpt: bytes) -> Outcome:
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    reason = f"HTTP {status}"
    said = answer_says(excerpt)
    if said:
        reason += f": {said}"
    if status == 429 or status >= 500:
        # Bitrix24's QUERY_LIMIT_EXCEEDED is a 503: a retry, like every 5xx.
        retry_after = parse_retry_after(headers.get("Retry-After"))
        return Outcome.retry(reason, status, excerpt, retry_after)
    return Outcome.fail(reason, status, excerpt)


# Where JSON APIs put their reason: Bitrix24 ({"error": "...", "error_description":
# "..."}), OAuth-style and most CRMs (error_description, message, detail).
_REASON_KEYS = ("error_description", "message", "detail", "description", "error")
_REASON_LIMIT = 200


def answer_says(excerpt: bytes) -> str:
    """The reason a JSON error answer gives, on one short line ("" if none).

    A person reading `relay stats`, an alert or the attempt log should see the
    CRM's "Phone is not valid", not only "HTTP 400"."""
    try:
        answer = orjson.loads(excerpt)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(answer, dict):
        return ""
    for key in _REASON_KEYS:
        value = answer.get(key)
        if isinstance(value, str) and value.strip():
            line = " ".join(value.split())
            return line if len(line) <= _REASON_LIMIT else line[: _REASON_LIMIT - 1] + "…"
    return ""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date
    (RFC 9110 section 10.2.3); None for anything else, which leaves the
    normal backoff (a header that cannot be read is no reason to lose the
    answer's status)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # not "²": str.isdigit takes it, float() not
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None
    return max(0.0, when - (now if now is not None else time.time()))
