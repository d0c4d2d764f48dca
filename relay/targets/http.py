"""The `http` target: a CRM API or any URL. Forwards the body as it came, or
builds a JSON or form body from templates; classifies the answer."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, urlencode

import orjson
from multidict import CIMultiDictProxy

from relay import __version__
from relay.budget import TemplateError
from relay.httpclient import (
    BadAnswer,
    Client,
    ConnectError,
    NoAnswer,
    RequestError,
    TLSError,
)
from relay.kinds.targets.http import HttpSettings, breaks_header
from relay.outcome import RESPONSE_EXCERPT_BYTES, Outcome, SentRequest
from relay.secrets import Masker
from relay.signing import signature_headers
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

    def sent(self) -> SentRequest:
        """This request as the attempt keeps it (the scheduler masks and cuts it)."""
        return SentRequest(self.method, self.url, tuple(self.headers.items()), self.body)


class SessionOwner:
    """A target that sends over its own kept-alive connections, opened by `start`."""

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._client: Client | None = None

    async def start(self) -> None:
        # As many idle connections kept as attempts may run at once.
        self._client = Client(keep=self._concurrency)

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
        super().__init__(concurrency)
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
            headers.update(
                signature_headers(settings.sign, envelope.delivery_id, envelope.sent_at, body)
            )
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
        return replace(await request(session, prepared), request=prepared.sent())


def header_values(rendered: dict[str, str]) -> dict[str, str]:
    """Rendered header values, refused when one cannot be a header (a line
    break from the payload), with the name of the header and the reason."""
    for name, value in rendered.items():
        if breaks_header(value):
            raise TemplateError(
                f"header {name}: the template's output contains a line break or NUL,"
                " which a header value cannot hold"
            )
    return rendered


async def request(session: Client, prepared: Request) -> Outcome:
    """One HTTP request, classified by its status."""
    return await exchange(session, prepared, classify)


async def exchange(
    session: Client,
    prepared: Request,
    judge: Callable[[int, CIMultiDictProxy[str], bytes], Outcome],
) -> Outcome:
    """Send a request; network trouble is a retry, the answer goes to `judge`.
    Redirects are not followed, compressed answers not asked for."""
    try:
        answer = await session.request(
            prepared.method,
            prepared.url,
            prepared.headers,
            prepared.body,
            keep=RESPONSE_EXCERPT_BYTES,
        )
    except RequestError as error:
        return Outcome.fail(str(error))
    except ConnectError as error:
        if error.dns:
            return Outcome.retry(f"DNS lookup failed for {error.host}")
        return Outcome.retry(f"cannot connect to {error.host}:{error.port}: {error.reason}")
    except TLSError as error:
        return Outcome.retry(f"TLS error: {error}")
    except NoAnswer:
        return Outcome.retry("server closed the connection without answering")
    except BadAnswer as error:
        return Outcome.retry(f"invalid HTTP response: {error}")
    except OSError as error:
        return Outcome.retry(f"connection error: {error.strerror or error}")
    return judge(answer.status, answer.headers, answer.excerpt)


def classify(status: int, headers: CIMultiDictProxy[str], excerpt: bytes) -> Outcome:
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    if 300 <= status < 400:
        return Outcome.fail(f"HTTP {status}: redirects are not followed", status, excerpt)
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
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))
