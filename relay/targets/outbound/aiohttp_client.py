"""aiohttp's client as a transport (`transport = "aiohttp"` on a target): the
same interface as relay's own client (relay.targets.outbound.client), the
same bounds against a hostile target, over aiohttp's connector, parser and
TLS. What aiohttp would do on its own that relay does not want is switched
off here: redirects, cookies, compression, its own time limits, guessed
headers.

Where aiohttp cannot do as relay's client does, it is said where it matters:
a paced target's turn is awaited before the connection is opened, not once
it is open (aiohttp has no hook between the two).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from relay.targets.outbound.client import (
    ENVIRONMENT,
    FRAMING,
    KEEPALIVE_SECONDS,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    Proxy,
    environment_proxy,
    replayable,
    unsendable,
    why,
)
from relay.targets.outbound.transport import (
    Answer,
    BadAnswer,
    ClientError,
    ConnectError,
    NoAnswer,
    ProxyError,
    Request,
    RequestError,
    TLSError,
    TransportError,
)

# What aiohttp adds unless told not to: relay asks for no compression, and
# says a body's type only when it knows it.
_NOT_ADDED = ("Accept-Encoding", "Content-Type")


class AiohttpTransport:
    """A target's connections in one aiohttp ClientSession."""

    def __init__(
        self,
        keep: int,
        *,
        tls: ssl.SSLContext | None = None,
        proxy: Proxy | str | None = None,
    ) -> None:
        """As relay's Client: `tls` the context https URLs are verified with,
        `proxy` one for every request, ENVIRONMENT or None."""
        self._keep = keep
        self._tls: ssl.SSLContext | bool = tls if tls is not None else True
        self._proxy = proxy
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(_reused)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0,  # the scheduler bounds the attempts at once
                    keepalive_timeout=KEEPALIVE_SECONDS,
                    ssl=self._tls,
                ),
                # The scheduler's time limit is the only one (see Transport.send).
                timeout=aiohttp.ClientTimeout(total=None),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                trust_env=False,  # the environment's proxy is read as relay's client reads it
                skip_auto_headers=_NOT_ADDED,
                trace_configs=[trace],
                max_line_size=MAX_HEAD_BYTES,
                max_field_size=MAX_HEAD_BYTES,
                max_headers=MAX_HEADERS,
            )
        return self._session

    def _proxy_for(self, url: str) -> Proxy | None:
        if self._proxy == ENVIRONMENT:
            return environment_proxy(url)
        return self._proxy if isinstance(self._proxy, Proxy) else None

    async def send(
        self,
        request: Request,
        *,
        keep: int,
        body_by: Callable[[], float] | None = None,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """Transport.send: see relay.targets.outbound.transport."""
        if before_write is not None:
            await before_write()
        problem = unsendable(request.headers)
        if problem is not None:
            raise RequestError(problem)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in FRAMING}
        headers.setdefault("Accept", "*/*")
        proxy = self._proxy_for(request.url)
        # A kept-alive connection the server closed as the request went out
        # is tried again on another, as relay's client does, when the server
        # may read the request twice (relay.targets.outbound.client.replayable).
        tries = self._keep + 1 if replayable(request.method, headers) else 1
        for tried in range(1, tries + 1):
            context = SimpleNamespace(reused=False)
            try:
                return await self._once(request, headers, proxy, keep, body_by, context)
            except NoAnswer:
                if not context.reused or tried == tries:
                    raise
        raise AssertionError("unreachable")

    async def _once(
        self,
        request: Request,
        headers: Mapping[str, str],
        proxy: Proxy | None,
        keep: int,
        body_by: Callable[[], float] | None,
        context: SimpleNamespace,
    ) -> Answer:
        session = self._open()
        proxy_url = proxy_headers = None
        if proxy is not None:
            proxy_url = f"http://{_authority(proxy.host, proxy.port)}"
            if proxy.authorization is not None:
                credentials = {"Proxy-Authorization": proxy.authorization}
                if request.url.startswith("https:"):
                    proxy_headers = credentials  # on the CONNECT, not inside the tunnel
                else:
                    # The proxy reads the request itself (absolute form): aiohttp
                    # puts proxy_headers on a CONNECT only.
                    headers = {**headers, **credentials}
        try:
            response = await session.request(
                request.method,
                request.url,
                headers=headers,
                data=request.body,
                allow_redirects=False,
                proxy=proxy_url,
                proxy_headers=proxy_headers,
                trace_request_ctx=context,
            )
        except aiohttp.ClientError as error:
            raise _translated(error, request.url, proxy) from None
        except (ValueError, UnicodeError) as error:  # yarl, or a header aiohttp cannot write
            raise RequestError(f"cannot be sent: {error}") from None
        whole = True
        body = bytearray()
        try:
            deadline = body_by() if body_by is not None else None
            async with asyncio.timeout_at(deadline):
                while len(body) < keep:
                    chunk = await response.content.readany()
                    if not chunk:
                        break
                    body += chunk
        except TimeoutError:
            whole = False  # the status came: it is the answer (Transport.send)
        except (aiohttp.ClientError, OSError):
            pass  # the status came: a body cut short is kept as far as it came
        finally:
            if whole and response.content.at_eof():
                response.release()
            else:
                response.close()  # more than is kept, or stalled: the rest is never read
        headers_in = CIMultiDictProxy(CIMultiDict(response.headers))
        return Answer(response.status, headers_in, bytes(body[:keep]), whole)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _reused(session: Any, trace_context: SimpleNamespace, params: Any) -> None:
    request_context = trace_context.trace_request_ctx
    if isinstance(request_context, SimpleNamespace):
        request_context.reused = True


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _translated(error: aiohttp.ClientError, url: str, proxy: Proxy | None) -> ClientError:
    """aiohttp's exception as the transport interface's, each with its meaning."""
    if isinstance(error, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return RequestError(f"not a valid http(s) URL: {error}")
    if proxy is not None:
        where = f"proxy {proxy.host}:{proxy.port}"
        if isinstance(error, aiohttp.ClientHttpProxyError):
            said = f"HTTP {error.status}" + (
                " (proxy credentials refused)" if error.status == 407 else ""
            )
            target = URL(url)
            authority = _authority(target.raw_host or "", target.port or 443)
            return ProxyError(f"{where} refused CONNECT {authority}: {said}")
        if isinstance(error, aiohttp.ClientProxyConnectionError):
            return ProxyError(f"cannot connect to {where}: {why(error.os_error)}")
    if isinstance(error, aiohttp.ClientConnectorDNSError):
        if proxy is not None:
            return ProxyError(f"proxy {proxy.host}: DNS lookup failed")
        return ConnectError(error.host, error.port or 0, "", dns=True)
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return TLSError(str(error.certificate_error))
    if isinstance(error, aiohttp.ClientSSLError):
        return TLSError(str(error))
    if isinstance(error, aiohttp.ClientConnectorError):
        return ConnectError(error.host, error.port or 0, why(error.os_error))
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return NoAnswer()
    if isinstance(error, aiohttp.ClientResponseError):
        return BadAnswer(error.message or f"HTTP {error.status}")
    if isinstance(error, aiohttp.ClientOSError):
        if isinstance(error.__cause__ or error.__context__, ssl.SSLError):
            return TLSError(str(error))
        return NoAnswer()
    return TransportError(str(error) or type(error).__name__)
