"""A whole fake transport for the outbound policy's unit tests (httpx's
`_transports/mock.py`): answers come from a function of the request, no
socket is opened. It implements relay.targets.outbound.transport.Transport,
nothing of relay's own code is patched."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from multidict import CIMultiDict, CIMultiDictProxy

from relay.targets.outbound.transport import Answer, ClientError, Request

Handler = Callable[[Request], "Answer | ClientError"]


def answer(
    status: int, headers: Mapping[str, str] | None = None, body: bytes = b"", *, whole: bool = True
) -> Answer:
    return Answer(status, CIMultiDictProxy(CIMultiDict(headers or {})), body, whole)


class MockTransport:
    """Sends nothing: `handler` answers each request (or raises the ClientError
    it returns), and `requests` keeps what was asked, in order."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.closed = False

    async def send(
        self,
        request: Request,
        *,
        keep: int,
        body_by: Callable[[], float] | None = None,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> Answer:
        if before_write is not None:
            await before_write()
        self.requests.append(request)
        result = self.handler(request)
        if isinstance(result, ClientError):
            raise result
        return replace(result, excerpt=result.excerpt[:keep])  # never more than asked

    async def close(self) -> None:
        self.closed = True
