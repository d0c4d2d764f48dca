"""One webhook as relay sees it before storing: its parts, parsed once, on demand.

What a source profile checks and names (relay/sources), and what ingress
and `relay render` decide from (relay.ingress.plan): one value, so each
reads the same parsed body.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from multidict import CIMultiDictProxy

from relay.core.canonical import payload_digest
from relay.core.payload import Payload, parse_form, template_context


class Incoming:
    """A request on its way in: its payload, who sent it, and the server's own
    case-insensitive view of its headers when it has one. (A plain class, one
    made for every webhook: mypyc compiles its __init__.)"""

    def __init__(
        self,
        payload: Payload,
        remote: str | None = None,
        header_view: CIMultiDictProxy[str] | None = None,
    ) -> None:
        self.payload = payload
        self.remote = remote
        self.header_view = header_view

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self.header_view is not None:
            return self.header_view
        return self.payload.header_map

    # What templates read (RequestParts): the payload's views, parsed once.
    @property
    def header_map(self) -> CIMultiDictProxy[str]:
        return self.headers

    @property
    def body(self) -> bytes:
        return self.payload.body

    @property
    def query(self) -> str:
        return self.payload.query

    @property
    def content_type(self) -> str | None:
        return self.headers.get("Content-Type")

    @property
    def json(self) -> Any:
        return self.payload.json

    @property
    def form(self) -> dict[str, str] | None:
        return self.payload.form

    @property
    def query_fields(self) -> dict[str, str]:
        return self.payload.query_fields

    @functools.cached_property
    def exact_form(self) -> dict[str, str] | None:
        """The form as identity reads it (relay.core.exact): bytes that are not
        UTF-8 kept (as surrogates, which `stored_key` escapes), not folded into U+FFFD."""
        return parse_form(self.content_type, self.body, exact=True)

    @property
    def digest(self) -> bytes:
        """The payload's digest (relay.core.canonical), reusing the JSON already parsed."""
        return payload_digest(self.body, self.content_type, self.json)

    def context(self, wanted: Iterable[str]) -> dict[str, Any]:
        return template_context(wanted, self)
