"""The transport seam: one request out, one bounded answer back (httpx's
`_transports/base.py`). A transport knows connections, proxies, TLS and the
wire; it never follows a redirect, reads a status's meaning or adds a header
of its own choosing beyond framing (Host, Content-Length, Accept). All of
that is policy, in relay.targets.outbound.policy, the same over every
transport.

Everything `Transport.send` raises is a ClientError, each kind with one
meaning for a delivery (`retryable`):

    ClientError
    ├── RequestError         the request cannot be made as asked: not retried
    └── TransportError       the network or the server failed it: retried
        ├── ConnectError     no connection (refused, unreachable, DNS: `dns`)
        ├── ProxyError       the proxy refused or failed the tunnel
        ├── TLSError         the handshake failed (certificate, protocol)
        ├── NoAnswer         closed before its answer's status
        └── BadAnswer        what came back is not HTTP/1.x
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qsl

import orjson
from multidict import CIMultiDictProxy

from relay.core.outcome import SentRequest
from relay.core.payload import media_type
from relay.core.secrets import Masker


class ClientError(Exception):
    """Anything `Transport.send` raises; `retryable` is what it means for a delivery."""

    retryable = True


class RequestError(ClientError):
    """The request cannot be made as asked (a header with a line break...)."""

    retryable = False


class TransportError(ClientError):
    """The network or the server failed the request: worth trying again later."""


class ConnectError(TransportError):
    """No connection to host:port; `reason` says why, `dns` when the name did not resolve."""

    def __init__(self, host: str, port: int, reason: str, *, dns: bool = False) -> None:
        super().__init__(
            f"DNS lookup failed for {host}" if dns else f"cannot connect to {host}:{port}: {reason}"
        )
        self.host = host
        self.port = port
        self.reason = reason
        self.dns = dns


class ProxyError(TransportError):
    """The proxy could not be reached, or refused or failed the tunnel."""


class TLSError(TransportError):
    """The TLS handshake failed (certificate, protocol)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"TLS error: {reason}")
        self.reason = reason


class NoAnswer(TransportError):
    """The server closed the connection before its answer's status.

    `written`: whether the request went out at all (a connection found
    closed when it was taken sent nothing); `heard`: whether any byte of an
    answer came before the close."""

    def __init__(self, *, written: bool = True, heard: bool = False) -> None:
        super().__init__("server closed the connection without answering")
        self.written = written
        self.heard = heard


class BadAnswer(TransportError):
    """What came back is not HTTP/1.x."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid HTTP response: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class Request:
    """One HTTP request as a target made it: what goes out, and what is shown of it."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes

    def display(self, *, wire: bool = False) -> str:
        """For display (`relay render`, the resend preview): credential headers
        are masked. A form body shows its fields decoded, one a line; a JSON
        body indented, its text as text (a template's `tojson` writes Cyrillic
        as \\u escapes: valid, and unreadable) — unless `wire` asks for the
        bytes that go out."""
        masker = Masker()
        lines = [f"{self.method} {masker.text(self.url)}"]
        lines += [f"{name}: {masker.header(name, value)}" for name, value in self.headers.items()]
        kind = media_type(self.headers.get("Content-Type", ""))
        if not wire and kind == "application/x-www-form-urlencoded":
            fields = parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True)
            lines += ["", "form fields (decoded):"]
            lines += [f"  {name} = {value}" for name, value in fields]
            return "\n".join(lines)
        if not wire and (kind == "application/json" or kind.endswith("+json")):
            # Numbers orjson cannot hold (past 64 bits): the bytes as they are.
            with contextlib.suppress(orjson.JSONDecodeError, orjson.JSONEncodeError):
                pretty = orjson.dumps(orjson.loads(self.body), option=orjson.OPT_INDENT_2)
                return "\n".join([*lines, "", pretty.decode()])
        lines += ["", self.body.decode("utf-8", errors="replace")]
        return "\n".join(lines)

    def sent(self) -> SentRequest:
        """This request as the attempt keeps it (the scheduler masks and cuts it)."""
        return SentRequest(self.method, self.url, tuple(self.headers.items()), self.body)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: CIMultiDictProxy[str]
    excerpt: bytes  # at most the `keep` bytes asked for; the rest never read
    # False when the body stopped coming after the status and the caller's
    # `body_by` passed: the status is the answer, the excerpt what came of it.
    whole: bool = True


class Transport(Protocol):
    """Sends one request; knows nothing of redirects, statuses or retries."""

    async def send(
        self,
        request: Request,
        *,
        keep: int,
        body_by: Callable[[], float] | None = None,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        """The answer to `request`, with at most `keep` bytes of its body (the
        rest is never read: the connection is closed instead).

        `before_write` is awaited once, with the connection open, right before
        the request is first written (a paced target's turn). `body_by` gives,
        once it is written, the loop's time until which a body is waited for
        after the status came; the answer is returned with what came of it
        (`whole` False): a target that said 200 and stalls its body took the
        request. The caller bounds the whole time; cancelling closes the
        connection, never returns it to a pool. Raises only ClientError.
        """
        ...

    async def close(self) -> None: ...
