"""The `http` target: forward a delivery to a URL and classify the answer."""

from __future__ import annotations

import email.utils
import ssl
import time

import aiohttp

from relay import __version__
from relay.config import HttpTarget as HttpSettings
from relay.outcome import RESPONSE_EXCERPT_BYTES, Outcome
from relay.targets.base import Envelope, relay_headers

USER_AGENT = f"relay/{__version__}"


class HttpTarget:
    def __init__(self, name: str, settings: HttpSettings, *, concurrency: int) -> None:
        self.name = name
        self._settings = settings
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._concurrency * 2),
            # Proxies from the environment would silently change where data goes.
            trust_env=False,
            auto_decompress=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, envelope: Envelope) -> Outcome:
        assert self._session is not None, "target not started"
        headers = {"User-Agent": USER_AGENT, **self._settings.headers, **relay_headers(envelope)}
        if envelope.content_type:
            headers["Content-Type"] = envelope.content_type
        return await request(
            self._session, self._settings.method, self._settings.url, envelope.body, headers
        )


async def request(
    session: aiohttp.ClientSession, method: str, url: str, body: bytes, headers: dict[str, str]
) -> Outcome:
    """One HTTP request, classified. Shared by every target that speaks HTTP."""
    try:
        async with session.request(
            method, url, data=body, headers=headers, allow_redirects=False
        ) as response:
            excerpt = await read_excerpt(response)
            return classify(response.status, response.headers, excerpt)
    except aiohttp.ClientConnectorDNSError as error:
        return Outcome.retry(f"DNS lookup failed for {error.host}")
    except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError) as error:
        return Outcome.retry(f"TLS error: {_reason(error)}")
    except aiohttp.ClientConnectorError as error:
        return Outcome.retry(f"cannot connect to {error.host}:{error.port}: {_reason(error)}")
    except aiohttp.InvalidURL:
        return Outcome.fail("invalid URL")
    except aiohttp.ServerDisconnectedError:
        return Outcome.retry("server closed the connection without answering")
    except aiohttp.ClientResponseError as error:
        return Outcome.retry(f"invalid HTTP response: {error.message}")
    except (aiohttp.ClientError, OSError) as error:
        return Outcome.retry(f"connection error: {_reason(error)}")


async def read_excerpt(response: aiohttp.ClientResponse) -> bytes:
    """At most RESPONSE_EXCERPT_BYTES of the body; the rest is never read."""
    chunks: list[bytes] = []
    size = 0
    while size < RESPONSE_EXCERPT_BYTES:
        chunk = await response.content.read(RESPONSE_EXCERPT_BYTES - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def classify(status: int, headers: aiohttp.typedefs.LooseHeaders, excerpt: bytes) -> Outcome:
    if 200 <= status < 300:
        return Outcome.success(status, excerpt)
    if 300 <= status < 400:
        return Outcome.fail(f"HTTP {status}: redirects are not followed", status, excerpt)
    if status == 429:
        retry_after = parse_retry_after(_header(headers, "Retry-After"))
        return Outcome.retry(f"HTTP {status}", status, excerpt, retry_after)
    if status >= 500:
        retry_after = parse_retry_after(_header(headers, "Retry-After"))
        return Outcome.retry(f"HTTP {status}", status, excerpt, retry_after)
    return Outcome.fail(f"HTTP {status}", status, excerpt)


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


def _header(headers: aiohttp.typedefs.LooseHeaders, name: str) -> str | None:
    getter = getattr(headers, "get", None)
    value = getter(name) if getter is not None else None
    return str(value) if value is not None else None


def _reason(error: BaseException) -> str:
    inner = getattr(error, "os_error", None)
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(error) or type(error).__name__
