"""The request an attempt keeps (beside the target's answer, for a person to
read): bounded as a whole, masked before it is cut.

Every part a sender or a template can make large is bounded: the URL, each
header's value, the headers together, the body. So one 878 KiB webhook whose
template copies a field into a header keeps a few KiB an attempt, not the
whole of it every attempt of its cycle. Each part is masked on a window
larger than what is kept, then cut: a secret across the cut is masked whole,
never left half in clear. What was cut says so, and `size` keeps how large
the body was.
"""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

from relay.core.outcome import RESPONSE_EXCERPT_BYTES, SentRequest
from relay.core.secrets import Masker, inbound_secrets, mask_fields, shown_body

URL_KEPT = 2048  # characters
HEADER_KEPT = 512  # characters of one header's value
HEADERS_KEPT = 4096  # characters of every header, names and values
CUT = "…"


def kept(request: SentRequest, masker: Masker) -> SentRequest:
    """`request` as its attempt keeps it: the config's secrets, credential
    headers and the request's own credentials (an api_key field, a ?token=)
    masked, each part cut to its bound."""
    body = request.body
    head = body[: 2 * RESPONSE_EXCERPT_BYTES]
    url = urlsplit(request.url[: 2 * URL_KEPT])
    content_type = next(
        (value for name, value in request.headers if name.lower() == "content-type"), None
    )
    # Most requests have none, and keep the config's compiled masker.
    own = frozenset(inbound_secrets(url.query, content_type, head))
    masker = _merged(masker, own) if own else masker
    shown = shown_body(head.decode("utf-8", "replace"), content_type, masker).encode()
    if len(body) > RESPONSE_EXCERPT_BYTES or len(shown) > RESPONSE_EXCERPT_BYTES:
        shown = _cut_bytes(shown, RESPONSE_EXCERPT_BYTES - len(CUT.encode())) + CUT.encode()
    return SentRequest(
        method=request.method,
        url=_cut(masker.text(url._replace(query=mask_fields(url.query)).geturl()), URL_KEPT),
        headers=_headers(request.headers, masker),
        body=shown,
        size=len(body),
    )


def _headers(headers: tuple[tuple[str, str], ...], masker: Masker) -> tuple[tuple[str, str], ...]:
    room = HEADERS_KEPT
    out: list[tuple[str, str]] = []
    for index, (name, whole) in enumerate(headers):
        value = masker.header(name, whole[: 2 * HEADER_KEPT])
        if len(whole) > 2 * HEADER_KEPT or len(value) > HEADER_KEPT:
            value = value[: HEADER_KEPT - len(CUT)] + CUT
        room -= len(name) + len(value)
        if room < 0:
            left = len(headers) - index
            out.append((CUT, f"{left} more header{'s' if left > 1 else ''} not kept"))
            break
        out.append((name, value))
    return tuple(out)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT)] + CUT


def _cut_bytes(data: bytes, limit: int) -> bytes:
    """The first `limit` bytes of UTF-8 text, never half a character."""
    return data[:limit].decode("utf-8", "ignore").encode()


@functools.lru_cache(maxsize=64)
def _merged(masker: Masker, own: frozenset[str]) -> Masker:
    """The config's masker with a request's own credentials: compiled once for
    credentials that come back (a target's token on every request)."""
    return masker.merged(Masker(own))
